"""Batch state in Redis (see gateway/batch/state.py for the layout): any replica can take over a batch."""

from __future__ import annotations

import time

import msgspec
from redis.exceptions import WatchError

from gateway.batch.objects import TERMINAL, StoredBatch, StoredFile
from gateway.batch.state import Change
from gateway.redis_client import AnyRedis

_CLAIM = """
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, 1)
if #lapsed > 0 then
  redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), lapsed[1])
  redis.call('HSET', KEYS[3], lapsed[1], ARGV[4])
  return tonumber(lapsed[1])
end
local n = tonumber(redis.call('GET', KEYS[2]) or '0')
if n >= tonumber(ARGV[3]) then return -1 end
redis.call('SET', KEYS[2], n + 1)
redis.call('ZADD', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]), n)
redis.call('HSET', KEYS[3], n, ARGV[4])
return n
"""
# KEYS leases, owners; ARGV until_ms, token, line...
_RENEW = """
for i = 3, #ARGV do
  if redis.call('HGET', KEYS[2], ARGV[i]) == ARGV[2] then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[i])
  end
end
return 0
"""
_RELEASE = """
if redis.call('HGET', KEYS[2], ARGV[2]) == ARGV[3] then
  redis.call('ZADD', KEYS[1], 'XX', ARGV[1], ARGV[2])
  redis.call('HDEL', KEYS[2], ARGV[2])
end
return 0
"""
# KEYS leases, owners, done, counts; ARGV line, ref, field
_FINISH = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 1 then
  redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
  return 1
end
return 0
"""
_LOCK = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
"""

_file = msgspec.json.Decoder(StoredFile)
_batch = msgspec.json.Decoder(StoredBatch)
_encode = msgspec.json.Encoder().encode
KEEP_S = 30 * 24 * 3600
"""How long a batch's state outlives it (the files keep their own life)."""


class RedisBatchState:
    def __init__(self, client: AnyRedis, prefix: str) -> None:
        self.client = client
        self.ns = "{syb:" + prefix + "}"
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._finish = client.register_script(_FINISH)
        self._lock = client.register_script(_LOCK)

    def _b(self, batch_id: str, part: str) -> str:
        return f"{self.ns}:b:{batch_id}:{part}"

    async def put_file(self, stored: StoredFile) -> None:
        await self.client.set(f"{self.ns}:file:{stored.file.id}", _encode(stored))

    async def get_file(self, file_id: str) -> StoredFile | None:
        raw = await self.client.get(f"{self.ns}:file:{file_id}")
        return _file.decode(raw) if raw is not None else None

    async def create(self, stored: StoredBatch) -> None:
        batch = stored.batch
        async with self.client.pipeline(transaction=True) as pipe:
            pipe.set(f"{self.ns}:batch:{batch.id}", _encode(stored))
            created = time.time()
            pipe.zadd(f"{self.ns}:owner:{stored.owner}", {batch.id: created})
            pipe.zadd(f"{self.ns}:batches", {batch.id: created})
            pipe.sadd(f"{self.ns}:active", batch.id)
            await pipe.execute()

    async def get(self, batch_id: str) -> StoredBatch | None:
        raw = await self.client.get(f"{self.ns}:batch:{batch_id}")
        return _batch.decode(raw) if raw is not None else None

    async def update(self, batch_id: str, change: Change) -> StoredBatch | None:
        key = f"{self.ns}:batch:{batch_id}"
        async with self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    await pipe.watch(key)
                    raw = await pipe.get(key)
                    if raw is None:
                        return None
                    changed = change(_batch.decode(raw))
                    if changed is None:
                        await pipe.unwatch()
                        return None
                    pipe.multi()
                    pipe.set(key, _encode(changed))
                    if changed.batch.status in TERMINAL:
                        pipe.srem(f"{self.ns}:active", batch_id)
                        for part in ("next", "leases", "owners", "done", "counts", "attempts"):
                            pipe.expire(self._b(batch_id, part), KEEP_S)
                    await pipe.execute()
                    return changed
                except WatchError:
                    continue

    async def page(self, owner: str | None, after: str | None, limit: int) -> tuple[list[StoredBatch], bool]:
        index = f"{self.ns}:owner:{owner}" if owner is not None else f"{self.ns}:batches"
        start = 0
        if after is not None:
            rank = await self.client.zrevrank(index, after)
            if rank is None:
                return [], False
            start = rank + 1
        ids = await self.client.zrevrange(index, start, start + limit)
        found = []
        if ids:
            raws = await self.client.mget([f"{self.ns}:batch:{i.decode()}" for i in ids[:limit]])
            found = [_batch.decode(raw) for raw in raws if raw is not None]
        return found, len(ids) > limit

    async def active(self) -> list[str]:
        return [m.decode() for m in await self.client.smembers(f"{self.ns}:active")]

    async def claim(self, batch_id: str, total: int, token: str, lease_s: float) -> int | None:
        now_ms = int(time.time() * 1000)
        keys = [self._b(batch_id, "leases"), self._b(batch_id, "next"), self._b(batch_id, "owners")]
        line = await self._claim(keys=keys, args=[now_ms, int(lease_s * 1000), total, token])
        return None if int(line) < 0 else int(line)

    async def renew(self, batch_id: str, lines: list[int], token: str, lease_s: float) -> None:
        until = int((time.time() + lease_s) * 1000)
        keys = [self._b(batch_id, "leases"), self._b(batch_id, "owners")]
        await self._renew(keys=keys, args=[until, token, *lines])

    async def release(self, batch_id: str, line: int, token: str, delay_s: float) -> None:
        until = int((time.time() + delay_s) * 1000)
        keys = [self._b(batch_id, "leases"), self._b(batch_id, "owners")]
        await self._release(keys=keys, args=[until, line, token])

    async def finish(self, batch_id: str, line: int, ref: str, failed: bool) -> bool:
        keys = [self._b(batch_id, p) for p in ("leases", "owners", "done", "counts")]
        field = "failed" if failed else "completed"
        return bool(await self._finish(keys=keys, args=[line, ref, field]))

    async def progress(self, batch_id: str) -> tuple[int, int, int]:
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.hmget(self._b(batch_id, "counts"), ["completed", "failed"])
            pipe.zcard(self._b(batch_id, "leases"))
            (completed, failed), leased = await pipe.execute()
        return int(completed or 0), int(failed or 0), int(leased)

    async def results(self, batch_id: str) -> dict[int, str]:
        raw = await self.client.hgetall(self._b(batch_id, "done"))
        return {int(k): v.decode() for k, v in raw.items()}

    async def attempt(self, batch_id: str, line: int) -> int:
        return int(await self.client.hincrby(self._b(batch_id, "attempts"), str(line), 1))

    async def lock(self, batch_id: str, name: str, token: str, ttl_s: float) -> bool:
        key = self._b(batch_id, f"lock:{name}")
        return bool(await self._lock(keys=[key], args=[token, int(ttl_s * 1000)]))

    async def close(self) -> None:
        await self.client.aclose()
