"""What a key may hold in the batch API at once, and the answers when a request would go over it.

The limits come from `batches:` in the config, each overridden by the key's own field of the same name
(gateway/tenants/keys.py). The state stores check them atomically with the change they allow
(`BatchState.add_file`, `BatchState.create`), so replicas racing cannot go over them together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.config.batches import BatchOptions
from gateway.openai.errors import GatewayError
from gateway.tenants.keys import KeyRecord

Refusal = Literal["max_stored_files", "max_stored_bytes", "max_open_batches"]
"""The limit a change would go over."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One key's limits; None is unlimited."""

    max_file_bytes: int
    max_stored_files: int | None
    max_stored_bytes: int | None
    max_open_batches: int | None


def quota_for(options: BatchOptions, key: KeyRecord | None) -> Quota:
    """The config's limits, each replaced by the key's own where it has one (uploads stay under the config's
    `max_file_bytes`: requests larger than that are refused before they reach a handler)."""

    def pick(name: str) -> int | None:
        own = getattr(key, name, None) if key is not None else None
        return own if own is not None else getattr(options, name)

    own_upload = key.max_file_bytes if key is not None else None
    upload = options.max_file_bytes if own_upload is None else min(own_upload, options.max_file_bytes)
    return Quota(upload, pick("max_stored_files"), pick("max_stored_bytes"), pick("max_open_batches"))


def file_too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"The file is larger than this key's upload limit of {limit} bytes.",
        "invalid_request_error",
        code="file_too_large",
        param="file",
    )


def over_quota(refusal: Refusal, quota: Quota) -> GatewayError:
    if refusal == "max_open_batches":
        return GatewayError(
            429,
            f"This key has {quota.max_open_batches} batches open, its limit (`max_open_batches`). "
            "Wait for one to end or cancel one.",
            "invalid_request_error",
            code="batch_quota_exceeded",
        )
    what = (
        f"{quota.max_stored_files} files"
        if refusal == "max_stored_files"
        else f"{quota.max_stored_bytes} bytes of files"
    )
    return GatewayError(
        429,
        f"This upload would take the key over its limit of {what} (`{refusal}`). "
        "Delete files (`DELETE /v1/files/{file_id}`) to make room.",
        "invalid_request_error",
        code="files_quota_exceeded",
        param="file",
    )


def file_in_use(file_id: str) -> GatewayError:
    return GatewayError(
        409,
        f"File '{file_id}' is the input of a batch that has not ended; cancel it or wait for it to end.",
        "invalid_request_error",
        code="file_in_use",
    )
