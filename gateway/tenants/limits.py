"""Counters shared by every replica: requests and tokens per window, requests in flight, dollars spent.

One Redis round trip admits a request: `ADMIT` checks every counter of the key and of its team and, only
if all fit, reserves in all of them (a Lua script runs atomically, so concurrent first requests of a new
key cannot both squeeze under a limit). Settling (actual tokens and cost, the parallel slot) is batched
off the request path: one `SETTLE` call for every request that ended in the last few milliseconds.

Windows are fixed, aligned on Redis's clock (`TIME`, so replicas with skewed clocks agree): within one
window exactly `rpm` requests are admitted, and the reset time the client is told is exact. The price is
the classic fixed-window edge: a client may use a full window at the end of one and again at the start of
the next. A sliding log would avoid that at O(limit) memory per key; the OpenAI SDK's retry logic reads
the reset header, which a fixed window answers exactly.

Amounts of money are integer nano-dollars in Redis (exact sums, no float drift).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gateway.tenants.keys import Limits

NANO = 1_000_000_000

SETTLE_ONE = """
local function settle_one(counter, delta, replica)
  if string.find(counter, ':pa:', 1, true) then
    -- Slots given back (delta < 0): on a hash gone meanwhile the field made here is deleted at once.
    if delta > 0 and redis.call('EXISTS', counter) == 0 then return end
    if redis.call('HINCRBY', counter, replica, delta) <= 0 then redis.call('HDEL', counter, replica) end
    return
  end
  -- Every counter but a `total` period's has a TTL from its creation on: one without a TTL after
  -- this INCRBY was made by it (its window or period had ended) and is not kept.
  local total = string.find(counter, ':total', -6, true) ~= nil
  if total and redis.call('EXISTS', counter) == 0 then return end
  local left = redis.call('INCRBY', counter, delta)
  if left == delta and not total and redis.call('PTTL', counter) == -1 then
    redis.call('DEL', counter)
  elseif left < 0 then
    redis.call('INCRBY', counter, -left)
  end
end
"""
"""Adds `delta` to `counter` where that counter still exists (an ended window or period is left alone),
never below zero; a parallel-slot hash (`:pa:`) in `replica`'s field. One Redis call in the usual case
(the counter exists and stays above zero), not an `EXISTS` before each."""

ADMIT = (
    SETTLE_ONE
    + """
local window_ms = tonumber(ARGV[1])
local replica, ns = ARGV[2], ARGV[3]
local leases = ns .. ':lease:'
local now = redis.call('TIME')
local second = now[1]
local now_ms = tonumber(second) * 1000 + math.floor(tonumber(now[2]) / 1000)
local window = math.floor(now_ms / window_ms)
local reset_ms = (window + 1) * window_ms - now_ms
local suffix = ':' .. window
local head = '|' .. reset_ms .. '|' .. window
local ttl = window_ms + 2000

-- First the settlements this replica had pending (as `SETTLE` does them): counter, delta pairs.
local settled = tonumber(ARGV[4])
for i = 5, 4 + 2 * settled, 2 do
  local delta = tonumber(ARGV[i+1])
  if delta ~= 0 then settle_one(ARGV[i], delta, replica) end
end

-- Counters are read once per batch and kept here; what the batch admitted is written once at the end.
local scopes, order, spends, limits = {}, {}, {}, {}

local function parse(arg)
  local l = limits[arg]
  if l then return l end
  local name, period, rpm, tpm, par, budget, bttl, pttl = string.match(arg,
    '^([^|]+)|([^|]+)|(-?%d+)|(-?%d+)|(-?%d+)|(-?%d+)|(-?%d+)|(-?%d+)$')
  l = {name = name, period = period, rpm = tonumber(rpm), tpm = tonumber(tpm), par = tonumber(par),
       budget = tonumber(budget), bttl = tonumber(bttl), pttl = tonumber(pttl),
       sk = ns .. ':sp:' .. name .. ':' .. period, hk = ns .. ':hd:' .. name .. ':' .. period}
  limits[arg] = l
  return l
end

-- Other replicas' slots count only while their lease lives; a lapsed replica's field is deleted.
local function live(s)
  s.live = true
  local held, pa = s.held, 0
  for j = 1, #held, 2 do
    if held[j] == replica or redis.call('EXISTS', leases .. held[j]) == 1 then
      pa = pa + tonumber(held[j+1])
    else
      redis.call('HDEL', s.pk, held[j])
    end
  end
  s.pa = pa
end

local function scope(l)
  local s = scopes[l.name]
  if not s then
    s = {rk = ns .. ':rq:' .. l.name .. suffix, tk = ns .. ':tk:' .. l.name .. suffix,
         pk = ns .. ':pa:' .. l.name, lu = ns .. ':lu:' .. l.name, sk = l.sk, pttl = l.pttl,
         drq = 0, dtk = 0, dpa = 0}
    local got = redis.call('MGET', s.rk, s.tk, l.sk, l.hk, s.lu)
    s.rq, s.tkn, s.new_rk, s.new_tk = tonumber(got[1] or '0'), tonumber(got[2] or '0'), not got[1], not got[2]
    s.spent, s.held_missing, s.last = got[3], not got[4], got[5]
    scopes[l.name] = s
    order[#order+1] = s
  end
  if l.par > 0 and s.pa == nil then
    local held = redis.call('HGETALL', s.pk)
    local pa = 0
    for j = 2, #held, 2 do pa = pa + tonumber(held[j]) end
    s.held, s.pa = held, pa
    -- Leases are looked at once a second (lapsed replicas' fields do not pile up in a busy scope's
    -- hash), and whenever the slots counted without them would refuse (`over`).
    if s.last ~= second and #held > 0 and not (#held == 2 and held[1] == replica) then live(s) end
  end
  return s
end

-- Would one more slot exceed `par`? Checked against live replicas' slots only before saying yes.
local function over(s, par)
  if s.pa + s.dpa + 1 <= par then return false end
  if not s.live then live(s) end
  return s.pa + s.dpa + 1 > par
end

local function spend(l, s)
  local key = l.sk
  local b = spends[key]
  if not b then
    local raw, held_missing, hk = s.spent, s.held_missing, l.hk
    if key ~= s.sk then raw, held_missing = redis.call('GET', key), redis.call('EXISTS', hk) == 0 end
    b = {key = key, hk = hk, sp = tonumber(raw or '0'), missing = not raw, held_missing = held_missing,
         d = 0, bttl = 0, charged = false}
    spends[key] = b
  end
  return b
end

local function admit(tokens, cost, first, last)
  for i = first, last do
    local l = parse(ARGV[i])
    local s = scope(l)
    local b = spend(l, s)
    local why = nil
    if l.rpm > 0 and s.rq + 1 > l.rpm then why = 'requests'
    elseif l.tpm > 0 and s.tkn + tokens > l.tpm then why = 'tokens'
    elseif l.par > 0 and over(s, l.par) then why = 'parallel'
    elseif l.budget >= 0 and b.sp + cost > l.budget then why = 'budget' end
    if why then
      return '0|' .. (i - first) .. '|' .. why .. head .. '|' .. s.rq .. '|' .. s.tkn .. '|' .. b.sp
    end
  end
  -- Every scope fits: all are charged (the counts answered are those after the reservation).
  local answer = '1|-1|' .. head
  for i = first, last do
    local l = limits[ARGV[i]]
    local s, b = scopes[l.name], spends[l.sk]
    s.rq, s.drq = s.rq + 1, s.drq + 1
    s.tkn, s.dtk = s.tkn + tokens, s.dtk + tokens
    s.dpa = s.dpa + 1
    s.pttl = l.pttl
    -- Every key's spend is kept, budget or not (an unbudgeted one reserves 0 and is charged at settling).
    b.sp, b.d, b.charged = b.sp + cost, b.d + cost, true
    if l.bttl > 0 then b.bttl = l.bttl end
    answer = answer .. '|' .. s.rq .. '|' .. s.tkn .. '|' .. b.sp
  end
  return answer
end

local out = {}
local i = 5 + 2 * settled
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  out[#out+1] = admit(tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), i + 3, i + 2 + n)
  i = i + 3 + n
end

-- A counter's TTL is set when it is made (it was missing when read); the slots' hash and the
-- last-used second once a second, and when this replica's field is made.
for _, s in ipairs(order) do
  if s.drq > 0 then
    redis.call('INCRBY', s.rk, s.drq)
    if s.new_rk then redis.call('PEXPIRE', s.rk, ttl) end
    redis.call('INCRBY', s.tk, s.dtk)
    if s.new_tk then redis.call('PEXPIRE', s.tk, ttl) end
    local stale = s.last ~= second
    if redis.call('HINCRBY', s.pk, replica, s.dpa) == s.dpa or stale then
      redis.call('EXPIRE', s.pk, s.pttl)
    end
    if stale then redis.call('SET', s.lu, second) end
  end
end
for _, b in pairs(spends) do
  if b.charged then
    if b.d ~= 0 or b.missing then
      redis.call('INCRBY', b.key, b.d)
      if b.missing and b.bttl > 0 then redis.call('EXPIRE', b.key, b.bttl) end
    end
    if b.d ~= 0 then
      redis.call('INCRBY', b.hk, b.d)
      if b.held_missing and b.bttl > 0 then redis.call('EXPIRE', b.hk, b.bttl) end
    end
  end
end
return table.concat(out, '\\n')
"""
)
"""Admits a batch of requests in order (each as if alone: all its scopes fit, then all are charged).
ARGV: window ms, this replica's id, the namespace (`{syt:<prefix>}`), the number of settlements this
replica had pending and as many (counter, delta) pairs (`Settler.take`: applied first, as `SETTLE` would;
so settling costs no call of its own while requests are admitted), then per request: its number of
scopes, tokens, cost (nano-USD), and one string per scope (key, then team):
`name|period|rpm|tpm|max_parallel|budget|spend TTL s|parallel TTL s` (0 = unlimited, budget -1 = none).
The counters' names are built here from the namespace (all under its hash tag, so in one Redis Cluster
slot); few arguments and one string for the whole answer keep the client's share of the round trip small
(the client splits it with one `bytes.split`, not a reply parsed per request). Returns one line per
request, `admitted|scope refused|limit refused|ms to window reset|window|counts` (per scope requests,
tokens and spend: after the reservation if admitted, before it if refused), the lines joined by `\n`.

Parallel slots are a hash per scope, one field per replica (its slots in flight). Each live replica keeps
a lease key (`<ns>:lease:<replica id>`, `SLOT_LEASE_S`) refreshed in the background; a field whose
replica's lease lapsed (the replica died, SIGKILL or a lost host) is not counted, so slots leaked by a
dead replica are free again within `SLOT_LEASE_S`. Leases are looked at when the slots counted without
them would refuse the request (so the answer is the same) and once a second per scope (a lapsed
replica's field is deleted then, so they do not pile up in a busy scope's hash), not in every batch.

Redis calls per batch, the usual case: `TIME`; per scope one `MGET` (the window's requests and tokens,
the period's spend, the last-used second), an `HGETALL` of the slots when the scope has a parallel limit,
then `INCRBY` x2, `HINCRBY`, and per spend counter an `INCRBY` (its held part one more); `EXPIRE`s only
when a counter is made, and for the slots' hash and `SET` of the last-used second once a second. Each
settlement riding along is one `INCRBY`/`HINCRBY` (`SETTLE_ONE`)."""

SETTLE = (
    SETTLE_ONE
    + """
local replica = ARGV[#KEYS + 1]
for i = 1, #KEYS do
  local delta = tonumber(ARGV[i])
  if delta ~= 0 then settle_one(KEYS[i], delta, replica) end
end
return #KEYS
"""
)
"""Adds ARGV[i] to KEYS[i] where that counter still exists (an ended window or period is left alone),
never below zero; a parallel-slot hash (`:pa:`) in this replica's field (the last ARGV). One call
settles a batch of requests."""

PARALLEL_TTL_S = 600
"""A scope's parallel-slot hash is dropped after this long idle."""
SLOT_LEASE_S = 3.0
"""A replica's parallel slots count only while its lease lives; it refreshes it every third of this."""


@dataclass(slots=True)
class ScopeCounters:
    """One set of limits being enforced: a key's (`k:<id>`) or a team's (`t:<name>`)."""

    name: str
    limits: Limits
    period: str
    """The budget period's id (`d2026-11-23`, `w2026-47`, `m2026-11`, `total`)."""
    period_ttl_s: int
    """Seconds the period's spend counter must live (0: forever)."""


@dataclass(slots=True)
class Verdict:
    admitted: bool
    refused_scope: int
    refused_by: str
    """`requests`, `tokens`, `parallel`, `budget` or `` when admitted."""
    reset_s: float
    window: int
    counts: list[int]
    """Per scope: requests and tokens in the window and spend (nano-USD), after the reservation if
    admitted, before it if refused."""


def budget_period(period: str, now: float) -> tuple[str, int]:
    """(id, seconds the counter must outlive) of the budget period containing `now`, in UTC."""
    if period == "total":
        return "total", 0
    t = time.gmtime(now)
    if period == "day":
        ident, left = time.strftime("d%Y-%m-%d", t), 86_400 - (int(now) % 86_400)
    elif period == "week":
        year, week, _ = _iso(now)
        ident, left = f"w{year}-{week:02d}", 7 * 86_400
    else:
        ident, left = time.strftime("m%Y-%m", t), 31 * 86_400
    return ident, left + 86_400


def _iso(now: float) -> tuple[int, int, int]:
    import datetime

    return datetime.datetime.fromtimestamp(now, datetime.UTC).isocalendar()


def nano(usd: float) -> int:
    return round(usd * NANO)


class LocalCounters:
    """The same counters in this process: the whole limit (memory store, one replica) or this replica's
    share of it while Redis is away (`share` = 1 / replicas)."""

    def __init__(self, window_s: float, share: float = 1.0) -> None:
        self.window_s = window_s
        self.share = share
        self._counts: dict[str, int] = {}
        self._window = -1

    def _roll(self, now: float) -> tuple[int, float]:
        window = int(now // self.window_s)
        if window != self._window:
            self._window = window
            for name in [n for n in self._counts if n.startswith(("rq:", "tk:"))]:
                del self._counts[name]
        return window, (window + 1) * self.window_s - now

    def _cap(self, limit: int | None) -> int:
        return 0 if limit is None else max(1, int(limit * self.share))

    def admit(self, scopes: list[ScopeCounters], tokens: int, cost: int) -> Verdict:
        window, reset = self._roll(time.time())
        get = self._counts.get
        counts: list[int] = []
        for i, scope in enumerate(scopes):
            lim, name = scope.limits, scope.name
            rq, tk = get("rq:" + name, 0), get("tk:" + name, 0)
            pa, sp = get("pa:" + name, 0), get(f"sp:{name}:{scope.period}", 0)
            rpm, tpm, par = self._cap(lim.rpm), self._cap(lim.tpm), self._cap(lim.max_parallel)
            budget = -1 if lim.budget_usd is None else int(nano(lim.budget_usd) * self.share)
            refused = (
                "requests"
                if rpm and rq + 1 > rpm
                else "tokens"
                if tpm and tk + tokens > tpm
                else "parallel"
                if par and pa + 1 > par
                else "budget"
                if budget >= 0 and sp + cost > budget
                else ""
            )
            if refused:
                return Verdict(False, i, refused, reset, window, [rq, tk, sp])
            counts += [rq + 1, tk + tokens, sp + cost]
        for scope in scopes:
            name, spend = scope.name, f"sp:{scope.name}:{scope.period}"
            self._counts["rq:" + name] = get("rq:" + name, 0) + 1
            self._counts["tk:" + name] = get("tk:" + name, 0) + tokens
            self._counts["pa:" + name] = get("pa:" + name, 0) + 1
            self._counts[spend] = get(spend, 0) + cost
            held = f"hd:{name}:{scope.period}"
            self._counts[held] = get(held, 0) + cost
            self._counts["lu:" + name] = int(time.time())
        return Verdict(True, -1, "", reset, window, counts)

    def settle(
        self, scopes: list[ScopeCounters], window: int, token_delta: int, cost_delta: int, held_delta: int = 0
    ) -> None:
        """`held_delta`: minus the reservation the request held (it is now settled)."""
        counts = self._counts
        for scope in scopes:
            name = scope.name
            counts["pa:" + name] = max(0, counts.get("pa:" + name, 0) - 1)
            if window == self._window and "tk:" + name in counts:
                counts["tk:" + name] = max(0, counts["tk:" + name] + token_delta)
            spend, held = f"sp:{name}:{scope.period}", f"hd:{name}:{scope.period}"
            if spend in counts:
                counts[spend] = max(0, counts[spend] + cost_delta)
            if held in counts:
                counts[held] = max(0, counts[held] + held_delta)
