"""AWS Signature Version 4 for S3 requests: the headers that authorize one request (no I/O).

Only what the file store sends: a method, a host, an already percent-encoded path, an optional query, and
the payload's SHA-256 or `UNSIGNED-PAYLOAD`. S3 signs the path as sent (it is not normalized again), the
signed headers are `host`, `x-amz-content-sha256`, `x-amz-date` and, with temporary credentials,
`x-amz-security-token`. tests/unit/test_sigv4.py checks it against botocore's signer byte for byte.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote

UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


@dataclass(frozen=True)
class Credentials:
    """An access key; its repr shows the key id only, so it never reaches a log or an error message."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def encode_path(key: str) -> str:
    """A key as S3 expects it in a path: every byte but unreserved characters and `/` percent-encoded."""
    return quote(key, safe="/~")


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = _hmac(f"AWS4{secret}".encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    return key


def sign(
    method: str,
    host: str,
    path: str,
    *,
    credentials: Credentials,
    region: str,
    payload_sha256: str = EMPTY_SHA256,
    query: str = "",
    service: str = "s3",
    now: datetime | None = None,
) -> dict[str, str]:
    """The headers to send with the request: `x-amz-date`, `x-amz-content-sha256`, the session token if
    any, and `Authorization`. `host` is the Host header as sent (with the port unless it is the scheme's
    default); `path` and `query` are already encoded (`query` sorted, as canonical form wants)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    day = stamp[:8]
    headers = {"host": host, "x-amz-content-sha256": payload_sha256, "x-amz-date": stamp}
    if credentials.session_token:
        headers["x-amz-security-token"] = credentials.session_token
    names = sorted(headers)
    signed = ";".join(names)
    canonical_headers = "".join(f"{name}:{' '.join(headers[name].split())}\n" for name in names)
    canonical = "\n".join([method.upper(), path, query, canonical_headers, signed, payload_sha256])
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _signing_key(credentials.secret_access_key, day, region, service)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    del headers["host"]  # the HTTP client sends it from the URL
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials.access_key_id}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return headers
