"""Batch state in Redis (see gateway/batch/state.py for the layout): any replica can take over a batch."""

from __future__ import annotations

import asyncio
import time
from typing import Literal, cast

import msgspec
from redis.exceptions import WatchError

from gateway.batch.objects import TERMINAL, StoredBatch, StoredFile
from gateway.batch.quota import Quota, Refusal
from gateway.batch.state import GONE_KEEP_S, Change, NotCreated, Order, UnknownCursor
from gateway.redis.client import AnyRedis, as_text

# KEYS record, owner's files, all files, owner's bytes, sequence; ARGV record, id, bytes, max files, max
# bytes ('' for no limit). A file already counted (an output written again) is replaced, never refused.
_ADD_FILE = """
local size = tonumber(ARGV[3])
local old = redis.call('GET', KEYS[1])
if old and redis.call('ZSCORE', KEYS[2], ARGV[2]) then
  redis.call('INCRBY', KEYS[4], size - cjson.decode(old)['file']['bytes'])
  redis.call('SET', KEYS[1], ARGV[1])
  return 'ok'
end
if ARGV[4] ~= '' and redis.call('ZCARD', KEYS[2]) + 1 > tonumber(ARGV[4]) then
  return 'max_stored_files'
end
if ARGV[5] ~= '' and tonumber(redis.call('GET', KEYS[4]) or '0') + size > tonumber(ARGV[5]) then
  return 'max_stored_bytes'
end
local seq = redis.call('INCR', KEYS[5])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], seq, ARGV[2])
redis.call('ZADD', KEYS[3], seq, ARGV[2])
redis.call('INCRBY', KEYS[4], size)
return 'ok'
"""
# KEYS record, owner's files, all files, owner's bytes, batches reading it, tombstone; ARGV the record as
# read, id, bytes, owner, tombstone's life (s)
_REMOVE_FILE = """
local now = redis.call('GET', KEYS[1])
if not now then return 'gone' end
if now ~= ARGV[1] then return 'changed' end
if redis.call('SCARD', KEYS[5]) > 0 then return 'in_use' end
local seq = redis.call('ZSCORE', KEYS[2], ARGV[2])
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
if seq then
  redis.call('DECRBY', KEYS[4], ARGV[3])
  redis.call('SET', KEYS[6], ARGV[4] .. ' ' .. seq, 'EX', ARGV[5])
end
return 'ok'
"""
# KEYS batch, owner's batches, active, owner's open batches, batches reading the input, input file, every
# batch (the admin's list);
# ARGV record, id, created, max open ('' for no limit)
_CREATE = """
if redis.call('EXISTS', KEYS[6]) == 0 then return 'no_file' end
if ARGV[4] ~= '' and redis.call('SCARD', KEYS[4]) >= tonumber(ARGV[4]) then return 'max_open_batches' end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[2])
redis.call('ZADD', KEYS[7], ARGV[3], ARGV[2])
return 'ok'
"""

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
        self._add_file = client.register_script(_ADD_FILE)
        self._remove_file = client.register_script(_REMOVE_FILE)
        self._create = client.register_script(_CREATE)
        self._quota_calls = asyncio.Lock()
        """Uploads, deletes and creates (the quota scripts) go one at a time per replica: they are rare and
        one round trip each, and a burst of them at once on a Redis Cluster client opened connections
        concurrently, which redis-py's asyncio cluster client can fail (`'NoneType' object has no attribute
        'writelines'`, seen with 40 concurrent uploads)."""

    def _b(self, batch_id: str, part: str) -> str:
        return f"{self.ns}:b:{batch_id}:{part}"

    def _file_keys(self, file_id: str, owner: str) -> list[str]:
        ns = self.ns
        return [f"{ns}:file:{file_id}", f"{ns}:files:{owner}", f"{ns}:files", f"{ns}:fbytes:{owner}"]

    async def _put(self, stored: StoredFile, max_files: int | None, max_bytes: int | None) -> str:
        meta = stored.file
        keys = [*self._file_keys(meta.id, stored.owner), f"{self.ns}:fseq"]
        limits = ["" if n is None else n for n in (max_files, max_bytes)]
        async with self._quota_calls:
            answer = await self._add_file(keys=keys, args=[_encode(stored), meta.id, meta.bytes, *limits])
        return answer.decode() if isinstance(answer, bytes) else str(answer)

    async def add_file(self, stored: StoredFile, quota: Quota) -> Refusal | None:
        answer = await self._put(stored, quota.max_stored_files, quota.max_stored_bytes)
        return None if answer == "ok" else cast(Refusal, answer)

    async def put_file(self, stored: StoredFile) -> None:
        await self._put(stored, None, None)

    async def get_file(self, file_id: str) -> StoredFile | None:
        raw = await self.client.get(f"{self.ns}:file:{file_id}")
        return _file.decode(raw) if raw is not None else None

    async def remove_file(self, file_id: str) -> StoredFile | Literal["in_use"] | None:
        while True:
            raw = await self.client.get(f"{self.ns}:file:{file_id}")
            if raw is None:
                return None
            stored = _file.decode(raw)
            keys = [
                *self._file_keys(file_id, stored.owner),
                f"{self.ns}:fuse:{file_id}",
                f"{self.ns}:fgone:{file_id}",
            ]
            args = [raw, file_id, stored.file.bytes, stored.owner, GONE_KEEP_S]
            async with self._quota_calls:
                answer = await self._remove_file(keys=keys, args=args)
            answer = answer.decode() if isinstance(answer, bytes) else str(answer)
            if answer == "ok":
                return stored
            if answer == "in_use":
                return "in_use"
            if answer == "gone":
                return None
            # `changed`: rewritten since it was read (an output written again); read it again.

    async def _cursor(self, index: str, owner: str | None, after: str) -> float:
        seq = await self.client.zscore(index, after)
        if seq is not None:
            return float(seq)
        gone = await self.client.get(f"{self.ns}:fgone:{after}")
        if gone is not None:
            whose, _, seq_text = as_text(gone).rpartition(" ")
            if owner is None or whose == owner:
                return float(seq_text)
        raise UnknownCursor(after)

    async def list_files(
        self, owner: str | None, after: str | None, limit: int, order: Order, purpose: str | None
    ) -> tuple[list[StoredFile], bool]:
        index = f"{self.ns}:files" if owner is None else f"{self.ns}:files:{owner}"
        desc = order == "desc"
        bound = (
            f"({await self._cursor(index, owner, after)!r}"
            if after is not None
            else ("+inf" if desc else "-inf")
        )
        chunk = limit + 1 if purpose is None else max(limit + 1, 200)
        found: list[StoredFile] = []
        while len(found) <= limit:
            if desc:
                ids = await self.client.zrevrangebyscore(
                    index, bound, "-inf", start=0, num=chunk, withscores=True
                )
            else:
                ids = await self.client.zrangebyscore(
                    index, bound, "+inf", start=0, num=chunk, withscores=True
                )
            if not ids:
                break
            # redis-py types a range reply alike with or without `withscores`; with it, items are pairs
            raws = await self.client.mget([f"{self.ns}:file:{i.decode()}" for i, _ in ids])  # type: ignore[str-unpack, union-attr]
            for raw in raws:
                stored = _file.decode(raw) if raw is not None else None
                if stored is not None and (purpose is None or stored.file.purpose == purpose):
                    found.append(stored)
            if len(ids) < chunk:
                break
            bound = f"({ids[-1][1]!r}"
        return found[:limit], len(found) > limit

    async def create(self, stored: StoredBatch, max_open: int | None = None) -> NotCreated | None:
        batch, ns = stored.batch, self.ns
        keys = [
            f"{ns}:batch:{batch.id}",
            f"{ns}:owner:{stored.owner}",
            f"{ns}:active",
            f"{ns}:open:{stored.owner}",
            f"{ns}:fuse:{batch.input_file_id}",
            f"{ns}:file:{batch.input_file_id}",
            f"{ns}:batches",
        ]
        args: list[bytes | str | float] = [
            _encode(stored),
            batch.id,
            time.time(),
            "" if max_open is None else max_open,
        ]
        async with self._quota_calls:
            answer = await self._create(keys=keys, args=args)
        answer = answer.decode() if isinstance(answer, bytes) else str(answer)
        return None if answer == "ok" else cast(NotCreated, answer)

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
                        pipe.srem(f"{self.ns}:open:{changed.owner}", batch_id)
                        pipe.srem(f"{self.ns}:fuse:{changed.batch.input_file_id}", batch_id)
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
            if not isinstance(rank, int):  # None: not in the index (a list only comes WITHSCORE)
                return [], False
            start = rank + 1
        ids = await self.client.zrevrange(index, start, start + limit)
        found = []
        if ids:
            # redis-py types a range reply as (member, score) pairs too, whatever `withscores` says
            raws = await self.client.mget([f"{self.ns}:batch:{i.decode()}" for i in ids[:limit]])  # type: ignore[union-attr]
            found = [_batch.decode(raw) for raw in raws if raw is not None]
        return found, len(ids) > limit

    async def active(self) -> list[str]:
        return [as_text(m) for m in await self.client.smembers(f"{self.ns}:active")]

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
        return {int(k): as_text(v) for k, v in raw.items()}

    async def attempt(self, batch_id: str, line: int) -> int:
        return int(await self.client.hincrby(self._b(batch_id, "attempts"), str(line), 1))

    async def lock(self, batch_id: str, name: str, token: str, ttl_s: float) -> bool:
        key = self._b(batch_id, f"lock:{name}")
        return bool(await self._lock(keys=[key], args=[token, int(ttl_s * 1000)]))

    async def close(self) -> None:
        await self.client.aclose()
