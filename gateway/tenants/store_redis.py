"""Keys and teams in Redis, shared by every replica.

Layout (all under one hash tag, so Redis Cluster keeps them in one slot):
    {syt:<prefix>}:key:<id>      the key's record (JSON, with the material's SHA-256, never the material)
    {syt:<prefix>}:hash:<sha256> -> <id>
    {syt:<prefix>}:keys          set of key ids
    {syt:<prefix>}:team:<name>   the team's record (JSON);  {syt:<prefix>}:teams  set of team names
    {syt:<prefix>}:version       bumped by every change; replicas poll it to drop cached lookups
"""

from __future__ import annotations

import msgspec

from gateway.redis.client import AnyRedis, as_text
from gateway.tenants.keys import KeyRecord, TeamRecord

_key_decoder = msgspec.json.Decoder(KeyRecord)
_team_decoder = msgspec.json.Decoder(TeamRecord)
_encode = msgspec.json.encode


def tenant_namespace(prefix: str) -> str:
    return "{syt:" + prefix + "}"


class RedisTenantStore:
    kind = "redis"

    def __init__(self, client: AnyRedis, prefix: str) -> None:
        self.client = client
        self.ns = tenant_namespace(prefix)

    async def key_by_hash(self, digest: str) -> KeyRecord | None:
        key_id = await self.client.get(f"{self.ns}:hash:{digest}")
        if key_id is None:
            return None
        return await self.get_key(key_id.decode() if isinstance(key_id, bytes) else key_id)

    async def get_key(self, key_id: str) -> KeyRecord | None:
        raw = await self.client.get(f"{self.ns}:key:{key_id}")
        return _key_decoder.decode(raw) if raw is not None else None

    async def put_key(self, record: KeyRecord, old_hash: str | None = None) -> int:
        async with self.client.pipeline(transaction=True) as tx:
            if old_hash is not None and old_hash != record.hash:
                tx.delete(f"{self.ns}:hash:{old_hash}")
            tx.set(f"{self.ns}:key:{record.id}", _encode(record))
            tx.set(f"{self.ns}:hash:{record.hash}", record.id)
            tx.sadd(f"{self.ns}:keys", record.id)
            tx.incr(f"{self.ns}:version")
            return int((await tx.execute())[-1])

    async def list_keys(self) -> list[KeyRecord]:
        ids = sorted(await self.client.smembers(f"{self.ns}:keys"))
        if not ids:
            return []
        raws = await self.client.mget([f"{self.ns}:key:{as_text(i)}" for i in ids])
        records = [_key_decoder.decode(raw) for raw in raws if raw is not None]
        return sorted(records, key=lambda k: k.created_at)

    async def get_team(self, name: str) -> TeamRecord | None:
        raw = await self.client.get(f"{self.ns}:team:{name}")
        return _team_decoder.decode(raw) if raw is not None else None

    async def put_team(self, team: TeamRecord) -> int:
        async with self.client.pipeline(transaction=True) as tx:
            tx.set(f"{self.ns}:team:{team.name}", _encode(team))
            tx.sadd(f"{self.ns}:teams", team.name)
            tx.incr(f"{self.ns}:version")
            return int((await tx.execute())[-1])

    async def delete_team(self, name: str) -> tuple[bool, int]:
        async with self.client.pipeline(transaction=True) as tx:
            tx.delete(f"{self.ns}:team:{name}")
            tx.srem(f"{self.ns}:teams", name)
            tx.incr(f"{self.ns}:version")
            deleted, _, version = await tx.execute()
        return bool(deleted), int(version)

    async def list_teams(self) -> list[TeamRecord]:
        names = sorted(await self.client.smembers(f"{self.ns}:teams"))
        if not names:
            return []
        raws = await self.client.mget([f"{self.ns}:team:{as_text(n)}" for n in names])
        return [_team_decoder.decode(raw) for raw in raws if raw is not None]

    async def version(self) -> int:
        raw = await self.client.get(f"{self.ns}:version")
        return int(raw) if raw is not None else 0

    async def close(self) -> None:
        await self.client.aclose()
