"""The `responses:` section of the gateway's config file: the store behind `previous_response_id` and
`GET`/`DELETE /v1/responses/{id}` (gateway/responses/; docs/api.md says why the gateway keeps it).

A module of its own, outside gateway/responses/, so the settings import it without the request path.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

_Bytes = Annotated[int, msgspec.Meta(ge=1024)]


class ResponsesOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    store: Literal["auto", "redis", "memory"] = "auto"
    """`auto` is Redis when `ledger.redis_url` is set (every replica finds every stored response), else
    this process's memory (a follow-up must reach the same replica; lost on restart)."""
    ttl_s: Annotated[float, msgspec.Meta(gt=0)] = 30 * 24 * 3600.0
    """How long a stored response can be read or continued from (OpenAI keeps them 30 days)."""
    max_bytes_per_key: _Bytes = 256 * 1024 * 1024
    """Stored responses of one API key (their input and output) take at most this much; storing past it
    drops that key's oldest responses first."""
    max_bytes_memory: _Bytes = 1024 * 1024 * 1024
    """The memory store (no Redis): all keys' stored responses together at most this much, the oldest of
    any key dropped first (in open mode every bearer token stores as a key of its own)."""
    max_response_bytes: _Bytes | None = None
    """A response larger than this (its whole input and output) is answered but not stored
    (`x-switchyard-response-stored: false`). Default: 16 MiB, or `max_bytes_per_key` if smaller."""

    def __post_init__(self) -> None:
        if self.max_response_bytes is not None and self.max_response_bytes > self.max_bytes_per_key:
            raise ValueError("max_response_bytes must not exceed max_bytes_per_key")

    @property
    def response_bytes_bound(self) -> int:
        return self.max_response_bytes or min(16 * 1024 * 1024, self.max_bytes_per_key)
