"""OpenAI's File and Batch objects, as the SDK reads them, plus the owner the API never shows."""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from gateway.request.parse import Endpoint

COMPLETION_WINDOW = "24h"
WINDOW_S = 24 * 3600.0
TERMINAL = frozenset({"completed", "failed", "expired", "cancelled"})
ENDPOINTS: dict[str, Endpoint] = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/embeddings": "embeddings",
    "/v1/responses": "responses",
}


def new_id(prefix: str) -> str:
    return f"{prefix}_{os.urandom(12).hex()}"


class FileObject(msgspec.Struct, kw_only=True):
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    object: str = "file"
    status: str = "processed"
    status_details: str | None = None
    expires_at: int | None = None


class StoredFile(msgspec.Struct, kw_only=True):
    file: FileObject
    owner: str
    path: str
    """Name in the file store."""


class RequestCounts(msgspec.Struct, kw_only=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class ErrorData(msgspec.Struct, kw_only=True):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, kw_only=True):
    data: list[ErrorData]
    object: str = "list"


class BatchObject(msgspec.Struct, kw_only=True):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: int
    object: str = "batch"
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = msgspec.field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None


class StoredBatch(msgspec.Struct, kw_only=True):
    batch: BatchObject
    owner: str
    """The key that created it (key id in `auth.mode: keys`, else the caller's key digest)."""
    authorization: str | None = None
    """Open mode only: the caller's Authorization, so its lines carry the same key in the ledger."""
    model: str | None = None
    deadline: float = 0.0
    """Unix time the batch expires at (the window, or `batches.window_s` when set)."""
    ending: str | None = None
    """While `finalizing`: the status it ends in (`completed`, `expired`, or `failed` when stopped)."""
    stop: ErrorData | None = None
    """Why its key stopped it (`key_revoked`, `key_expired`, `key_not_found`): the batch's error, and
    the error of each line it did not finish."""
    stopped_at: float = 0.0
    """Unix time it was stopped; finalized once every replica has had time to stop its lines."""


def now() -> int:
    return int(time.time())


encode = msgspec.json.Encoder().encode


def to_json(obj: Any) -> bytes:
    return encode(obj)


def list_page(data: list[Any], more: bool) -> dict[str, Any]:
    """One page of an OpenAI list (`files.list`, `batches.list`): the SDK pages on with `last_id`."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0].id if data else None,
        "last_id": data[-1].id if data else None,
        "has_more": more,
    }
