"""The `batches:` section of the gateway's config file (docs/batches.md; the API is gateway/batch/).

A module of its own, outside gateway/batch/, so the settings import it without importing the batch package
(which imports the request path, which imports the settings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

import msgspec

_Seconds = Annotated[float, msgspec.Meta(gt=0)]
_EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class S3Options(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """An S3-compatible bucket for file bodies and results, instead of `batches.directory`
    (gateway/batch/s3/files.py). The keys come from the environment, never from this file."""

    endpoint: Annotated[str, msgspec.Meta(pattern=r"^https?://[^/?#\s]+/?$")]
    """`https://s3.<region>.amazonaws.com`, or a MinIO, Ceph, R2 or Garage URL (`http://minio:9000`)."""
    bucket: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{2,254}$")]
    region: Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9-]+$")] = "us-east-1"
    prefix: Annotated[str, msgspec.Meta(pattern=r"^([^/.][^/]*/)*$")] = ""
    """Object names start with this (`switchyard/prod/`; ends with `/`, no `.` or `..` parts)."""
    addressing: Literal["path", "virtual"] = "path"
    """`path`: `<endpoint>/<bucket>/<name>` (every S3-compatible store); `virtual`: `<bucket>.<host>`."""
    sign_payload: bool = True
    """Sign each body's SHA-256 (the store checks it); false sends `UNSIGNED-PAYLOAD` (use with https)."""
    access_key_id_env: _EnvName = "AWS_ACCESS_KEY_ID"
    secret_access_key_env: _EnvName = "AWS_SECRET_ACCESS_KEY"
    session_token_env: _EnvName = "AWS_SESSION_TOKEN"
    """Temporary credentials' token, sent when this variable is set."""
    connect_timeout_s: _Seconds = 5.0
    read_timeout_s: _Seconds = 30.0
    """Longest wait for the next bytes of an answer (a large object may take longer as a whole)."""
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=10)] = 4
    """Tries per call on a 5xx, a 429 or a broken connection (writes are whole objects: safe to repeat)."""
    retry_backoff_s: Annotated[float, msgspec.Meta(ge=0)] = 0.2
    """The first retry's wait at most (full jitter); it doubles each retry, up to 5 s."""

    def unset_key_variable(self, environ: Mapping[str, str]) -> str | None:
        """The first of `access_key_id_env` and `secret_access_key_env` whose variable is unset or empty."""
        for field in ("access_key_id_env", "secret_access_key_env"):
            if not environ.get(getattr(self, field)):
                return field
        return None


class BatchOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    enabled: bool = True
    """Serve `/v1/files` and `/v1/batches`, and run batches from this replica."""
    directory: Annotated[str, msgspec.Meta(min_length=1)] = "switchyard-files"
    """Where uploaded files, per-line results and output files live (relative to the config file).
    Replicas that share batches must share this directory (a volume). Unused when `s3` is set."""
    s3: S3Options | None = None
    """File bodies and results in an S3-compatible bucket instead of `directory`."""
    store: Literal["auto", "redis", "memory"] = "auto"
    """Batch state: `auto` is Redis when `ledger.redis_url` is set (any replica can take over a batch),
    else memory (one replica; batches are lost with it)."""
    window_s: _Seconds | None = None
    """Overrides the `24h` completion window (tests, demos); the API still accepts only `24h`."""
    lease_s: _Seconds = 15.0
    """A claimed line's lease; renewed while it runs, so a line is re-claimed only after its replica died."""
    max_attempts: Annotated[int, msgspec.Meta(ge=1, le=20)] = 3
    """Times a line is sent before a backend failure (5xx, 429) becomes its error line."""
    retry_backoff_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    per_backend: Annotated[int, msgspec.Meta(ge=1, le=256)] = 48
    """At most this many batch lines in flight per backend, per replica; within it, a backend gets as many
    as its headroom allows (gateway/batch/headroom.py)."""
    kv_reserve: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.2
    """KV-cache fraction of each backend kept free of batch lines, for online bursts."""
    ramp_lines: Annotated[int, msgspec.Meta(ge=1, le=64)] = 2
    """New batch lines a backend gets per scrape of its metrics at most (the room is measured again
    before more are added)."""
    resume_after_s: Annotated[float, msgspec.Meta(ge=0)] = 2.0
    """A paused backend gets batch lines again once it has gone this long without a reason to pause."""
    slo_margin: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.75
    """Batch dispatch to a backend pauses when its predicted online TTFT or TPOT reaches this fraction of
    the tightest online SLO that may route there."""
    max_online_slowdown: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.02
    """While online requests run on a backend, its batch lines may slow their decode (time per output
    token) by at least this fraction, by the estimate in gateway/batch/slowdown.py; by more only when
    every class running there has a TPOT SLO with that much headroom (gateway/batch/headroom.py). A
    class the policy states no TPOT SLO for is held to this fraction."""
    tick_s: _Seconds = 0.05
    """How often the scheduler looks at the fleet for idle room."""
    max_file_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 200 * 1024 * 1024
    """The largest upload (413 `file_too_large`); a key's `max_file_bytes` may lower it, not raise it."""
    max_lines: Annotated[int, msgspec.Meta(ge=1)] = 50_000
    max_stored_files: Annotated[int, msgspec.Meta(ge=0)] | None = 1000
    """Files a key may hold at once (its uploads and its batches' output and error files); an upload over
    it is refused (429 `files_quota_exceeded`) until files are deleted. A key's own value overrides it;
    null: unlimited."""
    max_stored_bytes: Annotated[int, msgspec.Meta(ge=0)] | None = 10 * 1024**3
    """Bytes of files a key may hold at once (the same files, the same refusal)."""
    max_open_batches: Annotated[int, msgspec.Meta(ge=0)] | None = 20
    """Batches a key may have not yet completed, failed, expired or cancelled (429
    `batch_quota_exceeded`)."""
