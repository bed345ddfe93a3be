"""Batch state shared by replicas: files' metadata, batches, and each batch's line claims and results.

Lines are handed out by claim: a claim leases one line index to one replica for `lease_s` (renewed while
the line runs). A lease that lapses (its replica died) makes the line claimable again, so none is lost;
a result is recorded once per index (the first one wins), so none counts twice. The Redis store keeps
everything under the hash tag `{syb:<key_prefix>}` (one Redis Cluster slot):

    {syb:P}:file:<id>            JSON StoredFile
    {syb:P}:files                sorted set of every file id by its sequence number (the admin's list)
    {syb:P}:files:<key>          the same, the key's files only (its count: `max_stored_files`)
    {syb:P}:fbytes:<key>         bytes of the key's files (`max_stored_bytes`)
    {syb:P}:fseq                 the last file sequence number given
    {syb:P}:fgone:<id>           a deleted file's `<key> <sequence>` for a day: a list may page on after it
    {syb:P}:fuse:<id>            ids of the batches not ended that read the file (it cannot be deleted)
    {syb:P}:open:<key>           ids of the key's batches not ended (`max_open_batches`)
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
from typing import Literal, Protocol

from gateway.batch.objects import StoredBatch, StoredFile
from gateway.batch.quota import Quota, Refusal

Change = Callable[[StoredBatch], StoredBatch | None]
"""Given the current record, the new one, or None to leave it as it is."""

Order = Literal["asc", "desc"]
GONE_KEEP_S = 24 * 3600
"""How long a deleted file's place in the lists is kept, so a list may still page on after it."""


NotCreated = Literal["max_open_batches", "no_file"]
"""Why a batch was not created: its owner's open batches are at `max_open`, or its input is gone."""


class UnknownCursor(ValueError):
    """A list's `after` names no file of the lister's (nor one deleted in the last day)."""


class BatchState(Protocol):
    async def add_file(self, stored: StoredFile, quota: Quota) -> Refusal | None:
        """Record an uploaded file unless it would take its owner over `quota`: the limit it would go over
        (nothing recorded), or None."""
        ...

    async def put_file(self, stored: StoredFile) -> None:
        """Record a file the gateway wrote (a batch's output), counted but never refused; writing the same
        id again replaces it."""
        ...

    async def get_file(self, file_id: str) -> StoredFile | None: ...

    async def remove_file(self, file_id: str) -> StoredFile | Literal["in_use"] | None:
        """Forget a file (its owner's count and bytes go down): the record removed, `in_use` when a batch
        not ended reads it (nothing removed), None when there is no such file."""
        ...

    async def list_files(
        self, owner: str | None, after: str | None, limit: int, order: Order, purpose: str | None
    ) -> tuple[list[StoredFile], bool]:
        """The owner's files (every file for None) in upload order (`desc`: newest first), after the id
        `after`, of `purpose` when given; and whether more follow. Raises `UnknownCursor`."""
        ...

    async def create(self, stored: StoredBatch, max_open: int | None = None) -> NotCreated | None:
        """Record a new batch unless its owner has `max_open` open already or its input file is gone."""
        ...

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
