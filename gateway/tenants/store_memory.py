"""Keys and teams in this process only: the demo, and a single replica without Redis."""

from __future__ import annotations

from gateway.tenants.keys import KeyRecord, TeamRecord


class MemoryTenantStore:
    kind = "memory"

    def __init__(self) -> None:
        self._keys: dict[str, KeyRecord] = {}
        self._by_hash: dict[str, str] = {}
        self._teams: dict[str, TeamRecord] = {}
        self._version = 0

    async def key_by_hash(self, digest: str) -> KeyRecord | None:
        key_id = self._by_hash.get(digest)
        return self._keys.get(key_id) if key_id is not None else None

    async def get_key(self, key_id: str) -> KeyRecord | None:
        return self._keys.get(key_id)

    async def put_key(self, record: KeyRecord, old_hash: str | None = None) -> int:
        if old_hash is not None:
            self._by_hash.pop(old_hash, None)
        self._keys[record.id] = record
        self._by_hash[record.hash] = record.id
        self._version += 1
        return self._version

    async def list_keys(self) -> list[KeyRecord]:
        return sorted(self._keys.values(), key=lambda k: k.created_at)

    async def get_team(self, name: str) -> TeamRecord | None:
        return self._teams.get(name)

    async def put_team(self, team: TeamRecord) -> int:
        self._teams[team.name] = team
        self._version += 1
        return self._version

    async def delete_team(self, name: str) -> tuple[bool, int]:
        found = self._teams.pop(name, None) is not None
        self._version += 1
        return found, self._version

    async def list_teams(self) -> list[TeamRecord]:
        return sorted(self._teams.values(), key=lambda t: t.name)

    async def version(self) -> int:
        return self._version

    async def close(self) -> None:
        return None
