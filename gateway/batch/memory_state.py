"""Batch state in this process (one replica, the demo): the same contract as the Redis store."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from gateway.batch.objects import TERMINAL, StoredBatch, StoredFile
from gateway.batch.quota import Quota, Refusal
from gateway.batch.state import GONE_KEEP_S, Change, NotCreated, Order, UnknownCursor


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
    """Each call runs to its end without awaiting, so every check-then-change is atomic."""

    def __init__(self) -> None:
        self.files: dict[str, StoredFile] = {}
        self.batches: dict[str, StoredBatch] = {}
        self.lines: dict[str, _Lines] = {}
        self._seq: dict[str, int] = {}
        self._last_seq = 0
        self._gone: dict[str, tuple[str, int, float]] = {}
        """A deleted file's owner, sequence number and the time it was deleted."""

    def _held(self, owner: str) -> tuple[int, int]:
        mine = [f.file.bytes for f in self.files.values() if f.owner == owner]
        return len(mine), sum(mine)

    def _record(self, stored: StoredFile) -> None:
        if stored.file.id not in self._seq:
            self._last_seq += 1
            self._seq[stored.file.id] = self._last_seq
        self.files[stored.file.id] = stored

    async def add_file(self, stored: StoredFile, quota: Quota) -> Refusal | None:
        count, held = self._held(stored.owner)
        if quota.max_stored_files is not None and count + 1 > quota.max_stored_files:
            return "max_stored_files"
        if quota.max_stored_bytes is not None and held + stored.file.bytes > quota.max_stored_bytes:
            return "max_stored_bytes"
        self._record(stored)
        return None

    async def put_file(self, stored: StoredFile) -> None:
        self._record(stored)

    async def get_file(self, file_id: str) -> StoredFile | None:
        return self.files.get(file_id)

    async def remove_file(self, file_id: str) -> StoredFile | Literal["in_use"] | None:
        stored = self.files.get(file_id)
        if stored is None:
            return None
        readers = (b.batch for b in self.batches.values() if b.batch.input_file_id == file_id)
        if any(batch.status not in TERMINAL for batch in readers):
            return "in_use"
        del self.files[file_id]
        now = time.time()
        self._gone = {k: v for k, v in self._gone.items() if v[2] > now - GONE_KEEP_S}
        self._gone[file_id] = (stored.owner, self._seq.pop(file_id), now)
        return stored

    async def list_files(
        self, owner: str | None, after: str | None, limit: int, order: Order, purpose: str | None
    ) -> tuple[list[StoredFile], bool]:
        desc = order == "desc"
        mine = ((seq, i) for i, seq in self._seq.items() if owner is None or self.files[i].owner == owner)
        found = sorted(mine, reverse=desc)
        if after is not None:
            cursor = self._cursor(owner, after)
            found = [(seq, i) for seq, i in found if (seq < cursor if desc else seq > cursor)]
        files = [self.files[i] for _, i in found if purpose is None or self.files[i].file.purpose == purpose]
        return files[:limit], len(files) > limit

    def _cursor(self, owner: str | None, after: str) -> int:
        """The sequence number of the file `after` (or of one deleted lately), when the owner's."""
        stored = self.files.get(after)
        if stored is not None and owner in (None, stored.owner):
            return self._seq[after]
        gone = self._gone.get(after)
        if gone is not None and owner in (None, gone[0]):
            return gone[1]
        raise UnknownCursor(after)

    async def create(self, stored: StoredBatch, max_open: int | None = None) -> NotCreated | None:
        if stored.batch.input_file_id not in self.files:
            return "no_file"
        if max_open is not None:
            open_now = sum(
                1 for b in self.batches.values() if b.owner == stored.owner and b.batch.status not in TERMINAL
            )
            if open_now >= max_open:
                return "max_open_batches"
        self.batches[stored.batch.id] = stored
        self.lines[stored.batch.id] = _Lines()
        return None

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
