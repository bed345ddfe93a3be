"""The Redis ledger's buffer on disk, so records outlive the process while Redis is unreachable.

While Redis cannot be written, the flusher appends the records not yet on disk to an append-only file (one
JSON record a line) every `flush_interval`, with one fsync per append; at shutdown whatever is left is
appended too. The next start loads the file into the buffer ahead of new records; the flusher writes
them to Redis, which counts each request id once (so a record both applied and spilled is not counted
twice), and the file is truncated only once the buffer has drained, i.e. after Redis acknowledged every
record in it. A line torn by a kill mid-write is skipped (and logged) on load.

The buffer is the truth: `on_disk` counts the records at its head that are already in the file. One
process owns a spill file at a time (an flock on it, released by the kernel however the process ends);
a second gateway configured with the same path runs without spilling and says so. An empty spill file is
removed at a clean shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
from collections import deque
from collections.abc import Iterable
from itertools import islice
from pathlib import Path

import msgspec

from gateway.ledger.records import UsageRecord

log = logging.getLogger("switchyard.ledger")

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(UsageRecord)


def default_spill_path(key_prefix: str) -> Path:
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(state) / "switchyard" / f"ledger-{key_prefix}.spill"


class LedgerSpill:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.on_disk = 0
        """Records at the head of the buffer that are in the file."""
        self.dirty = False
        """The file holds records (not yet all acknowledged by Redis)."""
        self.spilled = 0
        self.replayed = 0
        self._lock_fd: int | None = None

    def claim(self) -> bool:
        """Take the file for this process; False if another process holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            log.error("ledger spill %s is in use by another process; this one will not spill", self.path)
            return False
        self._lock_fd = fd
        return True

    def release(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_size == 0:
                self.path.unlink()
        os.close(fd)

    def load(self) -> list[UsageRecord]:
        """The records a previous process left (blocking: call before serving)."""
        try:
            lines = self.path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        records: list[UsageRecord] = []
        torn = 0
        for line in lines:
            try:
                records.append(_decoder.decode(line))
            except (msgspec.DecodeError, UnicodeDecodeError):
                torn += 1
        if torn:
            log.warning("ledger spill %s: skipped %d unreadable lines", self.path, torn)
        if records:
            log.warning("ledger spill %s: %d records to replay into Redis", self.path, len(records))
        self.dirty = bool(lines)
        self.on_disk = len(records)
        self.replayed = len(records)
        return records

    async def append_new(self, buffer: deque[UsageRecord]) -> None:
        """Append the buffered records not yet on disk, fsynced (in a thread: never on the loop)."""
        start = self.on_disk
        if start >= len(buffer):
            return
        pending = list(islice(buffer, start, None))
        await asyncio.to_thread(self._append, pending)
        self.on_disk = start + len(pending)
        self.spilled += len(pending)
        self.dirty = True

    def _append(self, records: Iterable[UsageRecord]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(_encoder.encode(r) + b"\n" for r in records)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def acknowledged(self, count: int) -> None:
        """`count` records left the head of the buffer, written to Redis."""
        self.on_disk = max(0, self.on_disk - count)

    async def clear_if_drained(self, buffer: deque[UsageRecord]) -> None:
        """Truncate the file once every record in it was acknowledged (the buffer is empty)."""
        if self.dirty and not buffer:
            await asyncio.to_thread(self._truncate)
            self.dirty = False
            self.on_disk = 0

    def _truncate(self) -> None:
        try:
            with self.path.open("r+b") as file:
                file.truncate(0)
                os.fsync(file.fileno())
        except FileNotFoundError:
            pass
