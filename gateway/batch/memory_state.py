"""Batch state in this process (one replica, the demo): the same contract as the Redis store."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from gateway.batch.objects import TERMINAL, StoredBatch, StoredFile
from gateway.batch.state import Change


@dataclass
class _Lines:
    next: int = 0
    leases: dict[int, tuple[float, str]] = field(default_factory=dict)
    done: dict[int, str] = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    attempts: dict[int, int] = field(default_factory=dict)
    locks: dict[str, tuple[float, str]] = field(default_factory=dict)


class MemoryBatchState:
    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, StoredBatch] = {}
        self.lines: dict[str, _Lines] = {}

    async def put_file(self, stored: StoredFile) -> None:
        self.files[stored.file.id] = stored

    async def get_file(self, file_id: str) -> StoredFile | None:
        return self.files.get(file_id)

    async def create(self, stored: StoredBatch) -> None:
        self.batches[stored.batch.id] = stored
        self.lines[stored.batch.id] = _Lines()

    async def get(self, batch_id: str) -> StoredBatch | None:
        return self.batches.get(batch_id)

    async def update(self, batch_id: str, change: Change) -> StoredBatch | None:
        current = self.batches.get(batch_id)
        if current is None:
            return None
        changed = change(current)
        if changed is not None:
            self.batches[batch_id] = changed
        return changed

    async def page(self, owner: str | None, after: str | None, limit: int) -> tuple[list[StoredBatch], bool]:
        mine = [b for b in reversed(self.batches.values()) if owner is None or b.owner == owner]
        if after is not None:
            ids = [b.batch.id for b in mine]
            mine = mine[ids.index(after) + 1 :] if after in ids else []
        return mine[:limit], len(mine) > limit

    async def active(self) -> list[str]:
        return [i for i, b in self.batches.items() if b.batch.status not in TERMINAL]

    async def claim(self, batch_id: str, total: int, token: str, lease_s: float) -> int | None:
        lines = self.lines[batch_id]
        now = time.time()
        for line, (until, _) in lines.leases.items():
            if until <= now:
                lines.leases[line] = (now + lease_s, token)
                return line
        if lines.next >= total:
            return None
        line = lines.next
        lines.next += 1
        lines.leases[line] = (now + lease_s, token)
        return line

    async def renew(self, batch_id: str, lines: list[int], token: str, lease_s: float) -> None:
        leases = self.lines[batch_id].leases
        until = time.time() + lease_s
        for line in lines:
            if line in leases and leases[line][1] == token:
                leases[line] = (until, token)

    async def release(self, batch_id: str, line: int, token: str, delay_s: float) -> None:
        leases = self.lines[batch_id].leases
        if line in leases and leases[line][1] == token:
            leases[line] = (time.time() + delay_s, "")

    async def finish(self, batch_id: str, line: int, ref: str, failed: bool) -> bool:
        lines = self.lines[batch_id]
        lines.leases.pop(line, None)
        if line in lines.done:
            return False
        lines.done[line] = ref
        if failed:
            lines.failed += 1
        else:
            lines.completed += 1
        return True

    async def progress(self, batch_id: str) -> tuple[int, int, int]:
        lines = self.lines[batch_id]
        return lines.completed, lines.failed, len(lines.leases)

    async def results(self, batch_id: str) -> dict[int, str]:
        return dict(self.lines[batch_id].done)

    async def attempt(self, batch_id: str, line: int) -> int:
        attempts = self.lines[batch_id].attempts
        attempts[line] = attempts.get(line, 0) + 1
        return attempts[line]

    async def lock(self, batch_id: str, name: str, token: str, ttl_s: float) -> bool:
        locks = self.lines[batch_id].locks
        now = time.time()
        held = locks.get(name)
        if held is not None and held[0] > now and held[1] != token:
            return False
        locks[name] = (now + ttl_s, token)
        return True

    async def close(self) -> None:
        return None
