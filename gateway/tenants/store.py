"""Where keys and teams live: Redis for a fleet of replicas (store_redis.py), memory for the demo.

Every change bumps a version number; replicas poll it (off the request path) and drop their cached
lookups when it moves, which is how a revocation reaches every replica within one poll interval.
"""

from __future__ import annotations

from typing import Protocol

from gateway.tenants.keys import KeyRecord, TeamRecord


class TenantStore(Protocol):
    kind: str

    async def key_by_hash(self, digest: str) -> KeyRecord | None: ...

    async def get_key(self, key_id: str) -> KeyRecord | None: ...

    async def put_key(self, record: KeyRecord, old_hash: str | None = None) -> int:
        """Create or replace a key; `old_hash` (rotation) stops resolving at once. Returns the store's
        version after the change (as do the other changes)."""
        ...

    async def list_keys(self) -> list[KeyRecord]: ...

    async def get_team(self, name: str) -> TeamRecord | None: ...

    async def put_team(self, team: TeamRecord) -> int: ...

    async def delete_team(self, name: str) -> tuple[bool, int]: ...

    async def list_teams(self) -> list[TeamRecord]: ...

    async def version(self) -> int: ...

    async def close(self) -> None: ...
