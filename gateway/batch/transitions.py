"""Status changes of a batch, each applied atomically by the state store (`BatchState.update`).

Each returns None when the batch is no longer in the status the change starts from, so two replicas
racing to make the same change make it once.
"""

from __future__ import annotations

import time

import msgspec

from gateway.batch.objects import BatchErrors, ErrorData, RequestCounts, StoredBatch, now
from gateway.batch.state import Change


def _with(stored: StoredBatch, ending: str | None = None, **changes: object) -> StoredBatch:
    batch = msgspec.structs.replace(stored.batch, **changes)
    return msgspec.structs.replace(stored, batch=batch, ending=ending or stored.ending)


def to_failed(error: ErrorData) -> Change:
    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status != "validating":
            return None
        return _with(stored, status="failed", failed_at=now(), errors=BatchErrors(data=[error]))

    return change


def to_in_progress(total: int, model: str | None) -> Change:
    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status != "validating":
            return None
        changed = _with(
            stored, status="in_progress", in_progress_at=now(), request_counts=RequestCounts(total=total)
        )
        changed.model = model
        return changed

    return change


def to_finalizing(ending: str) -> Change:
    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status != "in_progress":
            return None
        return _with(stored, ending=ending, status="finalizing", finalizing_at=now())

    return change


def to_stopped(stop: ErrorData) -> Change:
    """`in_progress` to `finalizing`, ending `failed`: its key can no longer run its lines."""

    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status != "in_progress":
            return None
        changed = _with(stored, ending="failed", status="finalizing", finalizing_at=now())
        changed.stop = stop
        changed.stopped_at = time.time()
        return changed

    return change


def to_cancelling() -> Change:
    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status not in ("validating", "in_progress"):
            return None
        return _with(stored, status="cancelling", cancelling_at=now())

    return change


def to_cancelled_or_final() -> Change:
    """`cancelling` ends by writing what finished: through `finalizing`, ending `cancelled`."""

    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status != "cancelling":
            return None
        return _with(stored, ending="cancelled", status="finalizing", finalizing_at=now())

    return change


def to_final(ending: str, output_id: str | None, error_id: str | None, counts: RequestCounts) -> Change:
    """`finalizing` (or `cancelling`, ending `cancelled`) to its end, with the files written."""

    def change(stored: StoredBatch) -> StoredBatch | None:
        if stored.batch.status not in ("finalizing", "cancelling"):
            return None
        stamp = {
            "completed": "completed_at",
            "expired": "expired_at",
            "cancelled": "cancelled_at",
            "failed": "failed_at",
        }[ending]
        errors = BatchErrors(data=[stored.stop]) if stored.stop is not None else stored.batch.errors
        return _with(
            stored,
            status=ending,
            output_file_id=output_id,
            error_file_id=error_id,
            request_counts=counts,
            errors=errors,
            **{stamp: now()},
        )

    return change
