"""The two Lua scripts the Redis ledger runs; each is one round trip and atomic."""

RECORD = """
-- A batch of usage records. ARGV: tag, dedupe ttl, retention, payload. The payload holds the records
-- separated by \\30 (ASCII record separator), each with 18 fields separated by \\31 (unit separator):
-- request id, bucket start, backend, pool, vendor, model, key, class, req, in, out, busy_us, cost_nusd,
-- err, est, weighted tokens, bound nusd, rate bin.
-- (One argument per batch: the gateway then encodes one string, not 18 arguments per record.)
-- A record whose request id (gateway-made) is already known (SET NX fails) is skipped: re-sent batches
-- count once. Increments are summed per hash field first, then applied with one HINCRBY each.
-- Allocation sums go to the bucket only: 'aw|<backend>|<bin>|<name>' and 'ab|...' (weighted, bound), for
-- the backend, model, key and class dimensions (pool and vendor allocations are their backends').
local tag, dedupe, keep, payload = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local dims = {'backend', 'pool', 'vendor', 'model', 'key', 'class'}
local metrics = {'req', 'in', 'out', 'busy_us', 'cost_nusd', 'err', 'est'}
local sums, windows, added = {}, {}, 0
local function split(s, sep)
  local out, start = {}, 1
  while true do
    local i = string.find(s, sep, start, true)
    if not i then out[#out + 1] = string.sub(s, start); return out end
    out[#out + 1] = string.sub(s, start, i - 1)
    start = i + 1
  end
end
local function add(key, field, v)
  local h = sums[key]
  if not h then h = {}; sums[key] = h end
  h[field] = (h[field] or 0) + v
end
for _, line in ipairs(split(payload, '\\30')) do
  local r = split(line, '\\31')
  if #r == 18 and redis.call('SET', tag .. ':req:' .. r[1], '1', 'NX', 'EX', dedupe) then
    added = added + 1
    local w, bound, share = tonumber(r[16]), tonumber(r[17]), '|' .. r[3] .. '|' .. r[18] .. '|'
    for d = 1, 6 do
      local name = r[2 + d]
      local tot = tag .. ':tot:' .. dims[d]
      local win = tag .. ':m:' .. r[2] .. ':' .. dims[d]
      windows[win] = true
      for m = 1, 7 do
        local v = tonumber(r[8 + m])
        if v ~= 0 then
          local f = metrics[m] .. '|' .. name
          add(tot, f, v)
          add(win, f, v)
        end
      end
      if w ~= 0 and d ~= 2 and d ~= 3 then
        add(win, 'aw' .. share .. name, w)
        if bound ~= 0 then add(win, 'ab' .. share .. name, bound) end
      end
    end
  end
end
for key, fields in pairs(sums) do
  for f, v in pairs(fields) do redis.call('HINCRBY', key, f, string.format('%d', v)) end
end
for key in pairs(windows) do redis.call('EXPIRE', key, keep) end
return added
"""

CLAIM_PAID = """
-- Paid GPU time. ARGV: tag, retention, then (bucket start, backend, ms) triples.
-- Keeps the larger of the stored and the given value: replicas each claim the time they saw the
-- backend in the pool, so the bucket holds the longest view once, never the sum of replicas.
local tag, keep = ARGV[1], ARGV[2]
for i = 3, #ARGV, 3 do
  local key = tag .. ':m:' .. ARGV[i] .. ':backend'
  local field = 'paid_ms|' .. ARGV[i + 1]
  local v = tonumber(ARGV[i + 2])
  if v > tonumber(redis.call('HGET', key, field) or '0') then
    redis.call('HSET', key, field, ARGV[i + 2])
    redis.call('EXPIRE', key, keep)
  end
end
return 1
"""
