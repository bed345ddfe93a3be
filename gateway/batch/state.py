"""Batch state shared by replicas: files' metadata, batches, and each batch's line claims and results.

Lines are handed out by claim: a claim leases one line index to one replica for `lease_s` (renewed while
the line runs). A lease that lapses (its replica died) makes the line claimable again, so none is lost;
a result is recorded once per index (the first one wins), so none counts twice. The Redis store keeps
everything under the hash tag `{syb:<key_prefix>}` (one Redis Cluster slot):

    {syb:P}:file:<id>            JSON StoredFile
    {syb:P}:batch:<id>           JSON StoredBatch (changed under WATCH, so replicas never lose an update)
    {syb:P}:owner:<key>          sorted set of the key's batch ids by creation time (`GET /v1/batches`)
    {syb:P}:batches              sorted set of every batch id by creation time (an admin key's list)
    {syb:P}:active               set of batch ids not yet completed, failed, expired or cancelled
    {syb:P}:b:<id>:next          the next line never claimed
    {syb:P}:b:<id>:leases        sorted set line -> lease end (ms); :owners line -> claim token
    {syb:P}:b:<id>:done          hash line -> result reference (HSETNX: the first result wins)
    {syb:P}:b:<id>:counts        hash completed / failed;  :attempts line -> sends so far
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from gateway.batch.objects import StoredBatch, StoredFile

Change = Callable[[StoredBatch], StoredBatch | None]
"""Given the current record, the new one, or None to leave it as it is."""


class BatchState(Protocol):
    async def put_file(self, stored: StoredFile) -> None: ...

    async def get_file(self, file_id: str) -> StoredFile | None: ...

    async def create(self, stored: StoredBatch) -> None: ...

    async def get(self, batch_id: str) -> StoredBatch | None: ...

    async def update(self, batch_id: str, change: Change) -> StoredBatch | None:
        """Apply `change` atomically; the new record, or None when unchanged (or unknown)."""
        ...

    async def page(self, owner: str | None, after: str | None, limit: int) -> tuple[list[StoredBatch], bool]:
        """The owner's batches (every owner's: None) newest first, after the id `after`; and whether
        more follow."""
        ...

    async def active(self) -> list[str]: ...

    async def claim(self, batch_id: str, total: int, token: str, lease_s: float) -> int | None:
        """A line to run: a lapsed lease first, else the next line never claimed; None when none."""
        ...

    async def renew(self, batch_id: str, lines: list[int], token: str, lease_s: float) -> None: ...

    async def release(self, batch_id: str, line: int, token: str, delay_s: float) -> None:
        """Give a claimed line back, claimable again after `delay_s` (a retry)."""
        ...

    async def finish(self, batch_id: str, line: int, ref: str, failed: bool) -> bool:
        """Record the line's result; False when it already had one (this result is dropped)."""
        ...

    async def progress(self, batch_id: str) -> tuple[int, int, int]:
        """Lines completed, failed, and leased right now."""
        ...

    async def results(self, batch_id: str) -> dict[int, str]: ...

    async def attempt(self, batch_id: str, line: int) -> int:
        """Count one more send of the line; the sends so far."""
        ...

    async def lock(self, batch_id: str, name: str, token: str, ttl_s: float) -> bool:
        """Take (or keep, for the same token) a named lock on the batch for `ttl_s`."""
        ...

    async def close(self) -> None: ...
