"""Failed admin logins (the console's login form, a wrong key on `/admin/...`) slow down their client
address, so the admin key cannot be guessed at request speed.

Per address (an IPv6 client by its /64): the first `FREE_FAILURES - 1` failures cost nothing; the
`FREE_FAILURES`th and each one after it make the address wait, 1 s, then 2 s, 4 s, ... up to
`MAX_WAIT_S`. While it waits every admin login from it is refused unchecked (429), the right key too:
checking it would tell a guesser which guess was right. The count is forgotten `FORGET_AFTER_S` after
the last failure, or at a successful admin login. Other addresses are not affected, so a guesser cannot
lock the real admin out from elsewhere.

With Redis (the key store's) the count and the wait are shared by every replica; each replica also keeps
its own in memory (at most `MAX_ADDRESSES` addresses, the least recently failing dropped first), which
is what it goes by while Redis is unreachable. The address is the client the app sees (`scope["client"]`):
the TCP peer, or the client a trusted balancer names (PROXY protocol or X-Forwarded-For,
gateway/http/client_cap.py); behind any other proxy every client shares the proxy's.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.openai.errors import GatewayError
from gateway.redis.client import REDIS_ERRORS, AnyRedis

log = logging.getLogger("switchyard.tenants")

FREE_FAILURES = 5
FIRST_WAIT_S = 1.0
MAX_WAIT_S = 300.0
FORGET_AFTER_S = 900.0
MAX_ADDRESSES = 10_000
SURFACES = ("console", "admin_api")

# KEYS: failure count, wait. ARGV: forget after (ms), free failures, first wait (ms), max wait (ms).
_FAILED = """
local n = redis.call('INCR', KEYS[1])
local forget = tonumber(ARGV[1])
local free = tonumber(ARGV[2])
if n < free then
  redis.call('PEXPIRE', KEYS[1], forget)
  return 0
end
local wait = math.floor(math.min(tonumber(ARGV[3]) * 2 ^ (n - free), tonumber(ARGV[4])))
redis.call('SET', KEYS[2], '1', 'PX', wait)
redis.call('PEXPIRE', KEYS[1], forget + wait)
return wait
"""
_CHECK = "return {redis.call('PTTL', KEYS[2]), redis.call('EXISTS', KEYS[1])}"


def client_address(host: str | None) -> str:
    """The address failures are counted by: the host as given, an IPv6 one by its /64 network."""
    if not host:
        return "unknown"
    try:
        parsed = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, 64), strict=False))
    return str(parsed)


def retry_after(wait_s: float) -> str:
    return str(max(1, int(-(-wait_s // 1))))


def too_many_failed_logins(wait_s: float) -> GatewayError:
    return GatewayError(
        429,
        f"Too many failed logins from your address: try again in {retry_after(wait_s)} s.",
        "rate_limit_error",
        code="too_many_failed_logins",
        headers={"retry-after": retry_after(wait_s)},
    )


def wait_after(failures: int) -> float:
    """Seconds an address waits after its `failures`th failure in a row."""
    if failures < FREE_FAILURES:
        return 0.0
    return min(FIRST_WAIT_S * 2 ** min(failures - FREE_FAILURES, 64), MAX_WAIT_S)


@dataclass(slots=True)
class _Local:
    failures: int
    last: float
    until: float


@dataclass(frozen=True, slots=True)
class Gate:
    wait_s: float
    """How long the address must still wait (0: it may try)."""
    failed_before: bool
    """It has failures on record (a success then clears them)."""


class LoginThrottle:
    def __init__(
        self,
        client: AnyRedis | None = None,
        namespace: str = "",
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
        max_addresses: int = MAX_ADDRESSES,
    ) -> None:
        self._client = client
        self._prefix = f"{namespace}:login:"
        self._timeout_s = timeout_s
        self._clock = clock
        self._max = max_addresses
        self._local: OrderedDict[str, _Local] = OrderedDict()
        self._redis_failing = False
        self.failures: Counter[str] = Counter()
        self.throttled: Counter[str] = Counter()

    @property
    def addresses(self) -> int:
        """Addresses with failures on record in this replica's memory."""
        return len(self._local)

    def _keys(self, address: str) -> tuple[str, str]:
        return self._prefix + "n:" + address, self._prefix + "wait:" + address

    async def check(self, address: str) -> Gate:
        now = self._clock()
        entry = self._local.get(address)
        if entry is not None and now - entry.last > FORGET_AFTER_S and entry.until <= now:
            del self._local[address]
            entry = None
        local_wait = max(0.0, entry.until - now) if entry is not None else 0.0
        if local_wait > 0 or self._client is None:
            return Gate(local_wait, entry is not None)
        count, wait = self._keys(address)
        reply = await self._shared(self._client.eval(_CHECK, 2, count, wait))
        if reply is None:
            return Gate(local_wait, entry is not None)
        pttl, exists = int(reply[0]), int(reply[1])
        return Gate(max(local_wait, pttl / 1000 if pttl > 0 else 0.0), bool(exists) or entry is not None)

    def refused(self, surface: str) -> None:
        """An attempt refused unchecked because its address waits (counted for the metrics)."""
        self.throttled[surface] += 1

    async def failed(self, address: str, surface: str) -> float:
        """A wrong admin key from `address`; returns how long it must now wait."""
        self.failures[surface] += 1
        now = self._clock()
        entry = self._local.pop(address, None)
        if entry is None or (now - entry.last > FORGET_AFTER_S and entry.until <= now):
            entry = _Local(0, now, now)
        entry.failures += 1
        entry.last = now
        entry.until = now + wait_after(entry.failures)
        self._local[address] = entry  # last: the most recently failing
        while len(self._local) > self._max:
            self._local.popitem(last=False)
        wait = entry.until - now
        if self._client is not None:
            count, wait_key = self._keys(address)
            limits = (
                int(FORGET_AFTER_S * 1000),
                FREE_FAILURES,
                int(FIRST_WAIT_S * 1000),
                int(MAX_WAIT_S * 1000),
            )
            shared = await self._shared(self._client.eval(_FAILED, 2, count, wait_key, *limits))
            if shared is not None:
                wait = max(wait, int(shared) / 1000)
        return wait

    async def succeeded(self, address: str, gate: Gate) -> None:
        """An admin login from `address` passed: its failures are forgotten."""
        if not gate.failed_before:
            return
        self._local.pop(address, None)
        if self._client is not None:
            await self._shared(self._client.delete(*self._keys(address)))

    async def _shared(self, call: Awaitable[Any]) -> Any:
        """Redis's answer to `call`; None when Redis cannot be reached (memory alone then decides)."""
        try:
            async with asyncio.timeout(self._timeout_s):
                reply = await call
        except (TimeoutError, *REDIS_ERRORS) as exc:
            if not self._redis_failing:
                log.warning("admin login throttle: Redis unreachable (%s); this replica's count alone", exc)
            self._redis_failing = True
            return None
        self._redis_failing = False
        return reply

    def render(self) -> str:
        out = [
            "# HELP switchyard_admin_auth_failures_total Failed admin logins (a wrong key), by surface.",
            "# TYPE switchyard_admin_auth_failures_total counter",
        ]
        out += [f'switchyard_admin_auth_failures_total{{surface="{s}"}} {self.failures[s]}' for s in SURFACES]
        out += [
            "# HELP switchyard_admin_auth_throttled_total Admin logins refused unchecked: their address "
            "was waiting after failed ones.",
            "# TYPE switchyard_admin_auth_throttled_total counter",
        ]
        out += [
            f'switchyard_admin_auth_throttled_total{{surface="{s}"}} {self.throttled[s]}' for s in SURFACES
        ]
        return "\n".join(out) + "\n"
