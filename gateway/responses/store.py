"""Stored responses, per API key: what `previous_response_id` continues from and `GET`/`DELETE
/v1/responses/{id}` read.

An entry is one response with the whole input it answered (msgspec JSON, gateway/responses/api.py). Each
key's entries live `ttl_s`; together they take at most `max_bytes_per_key`, the oldest dropped first to
make room. A key sees only its own entries: every lookup is by (owner, id), so another key's id is
simply not found.

    Redis (`{syr:P:<owner>}` hash tag: one slot per key, so each script touches one slot)
        {syr:P:O}:data     hash   id -> entry
        {syr:P:O}:expiry   zset   id -> expiry (ms); all share one TTL, so the lowest is also the oldest
        {syr:P:O}:bytes    string the entries' total size
    The three keys expire with the key's last write, so a key that stops storing leaves nothing behind.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol

from gateway.redis.client import AnyRedis


class ResponseStore(Protocol):
    async def put(self, owner: str, response_id: str, entry: bytes) -> None: ...

    async def get(self, owner: str, response_id: str) -> bytes | None: ...

    async def delete(self, owner: str, response_id: str) -> bool: ...

    async def close(self) -> None: ...


class MemoryResponseStore:
    """This process's memory: without Redis (one replica; lost on restart). Besides each key's quota, all
    keys together hold at most `max_bytes_total` (in open mode every bearer token is a key of its own),
    the oldest entries of any key dropped first."""

    def __init__(
        self,
        ttl_s: float,
        max_bytes_per_key: int,
        max_bytes_total: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_bytes_per_key = max_bytes_per_key
        self.max_bytes_total = max_bytes_total if max_bytes_total is not None else 4 * max_bytes_per_key
        self._clock = clock
        self._entries: OrderedDict[tuple[str, str], tuple[float, bytes]] = OrderedDict()
        """Every key's entries, oldest first (all share one TTL, so also soonest to expire first)."""
        self._owned: dict[str, OrderedDict[str, None]] = {}
        """Each key's ids, oldest first."""
        self._bytes: dict[str, int] = {}
        self.total_bytes = 0

    def _expire(self) -> None:
        now = self._clock()
        entries = self._entries
        while entries:
            owner, response_id = next(iter(entries))
            if entries[owner, response_id][0] > now:
                return
            self._drop(owner, response_id)

    def _drop(self, owner: str, response_id: str) -> None:
        _, entry = self._entries.pop((owner, response_id))
        owned = self._owned[owner]
        del owned[response_id]
        self._bytes[owner] -= len(entry)
        self.total_bytes -= len(entry)
        if not owned:
            del self._owned[owner]
            del self._bytes[owner]

    async def put(self, owner: str, response_id: str, entry: bytes) -> None:
        self._expire()
        if (owner, response_id) in self._entries:
            self._drop(owner, response_id)
        while owner in self._owned and self._bytes[owner] + len(entry) > self.max_bytes_per_key:
            self._drop(owner, next(iter(self._owned[owner])))
        while self._entries and self.total_bytes + len(entry) > self.max_bytes_total:
            self._drop(*next(iter(self._entries)))
        self._entries[owner, response_id] = (self._clock() + self.ttl_s, entry)
        self._owned.setdefault(owner, OrderedDict())[response_id] = None
        self._bytes[owner] = self._bytes.get(owner, 0) + len(entry)
        self.total_bytes += len(entry)

    async def get(self, owner: str, response_id: str) -> bytes | None:
        self._expire()
        found = self._entries.get((owner, response_id))
        return found[1] if found is not None else None

    async def delete(self, owner: str, response_id: str) -> bool:
        self._expire()
        if (owner, response_id) not in self._entries:
            return False
        self._drop(owner, response_id)
        return True

    def bytes_of(self, owner: str) -> int:
        self._expire()
        return self._bytes.get(owner, 0)

    async def close(self) -> None:
        return None


# KEYS data, expiry, bytes; ARGV now_ms, ttl_ms, max_bytes, id, entry
_PUT = """
local now = tonumber(ARGV[1])
local used = tonumber(redis.call('GET', KEYS[3]) or '0')
local function drop(id)
  used = used - redis.call('HSTRLEN', KEYS[1], id)
  redis.call('HDEL', KEYS[1], id)
  redis.call('ZREM', KEYS[2], id)
end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do drop(id) end
if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1 then drop(ARGV[4]) end
local size = string.len(ARGV[5])
while used + size > tonumber(ARGV[3]) do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  drop(oldest[1])
end
if used < 0 then used = 0 end
redis.call('HSET', KEYS[1], ARGV[4], ARGV[5])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[4])
redis.call('SET', KEYS[3], used + size, 'PX', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return used + size
"""
# KEYS data, expiry; ARGV now_ms, id
_GET = """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not expiry or tonumber(expiry) <= tonumber(ARGV[1]) then return false end
return redis.call('HGET', KEYS[1], ARGV[2])
"""
# KEYS data, expiry, bytes; ARGV now_ms, id
_DELETE = """
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[2])
if not expiry or tonumber(expiry) <= tonumber(ARGV[1]) then return 0 end
local size = redis.call('HSTRLEN', KEYS[1], ARGV[2])
redis.call('HDEL', KEYS[1], ARGV[2])
redis.call('ZREM', KEYS[2], ARGV[2])
if redis.call('EXISTS', KEYS[3]) == 1 then redis.call('DECRBY', KEYS[3], size) end
return 1
"""


class RedisResponseStore:
    """Shared by every replica: a follow-up finds its previous response wherever it lands."""

    def __init__(self, client: AnyRedis, prefix: str, ttl_s: float, max_bytes_per_key: int) -> None:
        self.client = client
        self.prefix = prefix
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.max_bytes_per_key = max_bytes_per_key
        self._put = client.register_script(_PUT)
        self._get = client.register_script(_GET)
        self._delete = client.register_script(_DELETE)

    def keys(self, owner: str) -> list[str]:
        tag = "{syr:" + self.prefix + ":" + owner + "}"
        return [tag + ":data", tag + ":expiry", tag + ":bytes"]

    async def put(self, owner: str, response_id: str, entry: bytes) -> None:
        args: list[bytes | str | int] = [_now_ms(), self.ttl_ms, self.max_bytes_per_key, response_id, entry]
        await self._put(keys=self.keys(owner), args=args)

    async def get(self, owner: str, response_id: str) -> bytes | None:
        found = await self._get(keys=self.keys(owner)[:2], args=[_now_ms(), response_id])
        return bytes(found) if found is not None else None

    async def delete(self, owner: str, response_id: str) -> bool:
        return bool(await self._delete(keys=self.keys(owner), args=[_now_ms(), response_id]))

    async def bytes_of(self, owner: str) -> int:
        return int(await self.client.get(self.keys(owner)[2]) or 0)

    async def close(self) -> None:
        await self.client.aclose()


def _now_ms() -> int:
    return int(time.time() * 1000)
