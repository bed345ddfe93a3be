"""The `ledger:` section of the gateway's config file (docs/costs.md; the ledger is gateway/ledger/).

A module of its own, as gateway/config/batches.py, so gateway/config/settings.py stays one screenful of
sections;
`gateway.config.settings` re-exports `LedgerOptions`.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from gateway.redis.client import URL_PATTERN as REDIS_URL_PATTERN

_Seconds = Annotated[float, msgspec.Meta(gt=0)]


class LedgerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Where usage and cost go (see gateway/ledger/__init__.py for the Redis key layout and cost rules)."""

    store: Literal["auto", "redis", "memory", "none"] = "auto"
    """`auto`: Redis when `redis_url` is set, else in memory; `none` records nothing (benchmarks only)."""
    redis_url: Annotated[str, msgspec.Meta(pattern=REDIS_URL_PATTERN)] | None = None
    key_prefix: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:-]{1,64}$")] = "switchyard"
    bucket_seconds: Annotated[int, msgspec.Meta(ge=1, le=3600)] = 60
    retention: _Seconds = 48 * 3600.0
    dedupe_ttl: _Seconds = 3600.0
    """How long a request id is remembered, so a retry or a re-sent batch is never counted twice."""
    buffer_max: Annotated[int, msgspec.Meta(ge=1)] = 200_000
    batch_size: Annotated[int, msgspec.Meta(ge=1)] = 500
    flush_interval: _Seconds = 0.2
    paid_interval: _Seconds = 1.0
    refresh_interval: _Seconds = 5.0
    redis_timeout: _Seconds = 2.0
    spill: bool = True
    """While Redis is unreachable, keep the buffered records in a local file the next start replays."""
    spill_path: str | None = None
    """Default: `$XDG_STATE_HOME/switchyard/ledger-<key_prefix>.spill` (~/.local/state/...). One per
    gateway process: replicas on one host need their own."""
    output_token_weight: Annotated[float, msgspec.Meta(gt=0)] = 4.0
    """One output token costs this many input tokens' worth of GPU time (decode vs prefill)."""
    idle_cost: Literal["idle", "spread"] = "idle"
    """`idle`: GPU time no request used is reported as idle cost, charged to nobody. `spread`: each
    bucket's idle cost is spread over its requests by weighted tokens (gateway/ledger/allocation.py)."""
