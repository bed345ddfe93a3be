"""gateway/batch/s3/sigv4.py against an independent reference: botocore's S3 SigV4 signer, at a fixed time.

Each case signs the same request both ways and compares every header botocore adds, byte for byte.
"""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime

import botocore.auth
import pytest
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials as BotoCredentials

from gateway.batch.s3.sigv4 import UNSIGNED_PAYLOAD, Credentials, encode_path, sign

NOW = datetime(2026, 11, 25, 11, 7, 42, tzinfo=UTC)
KEY_ID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "FQoGZXIvYXdzEJr//////////wEaDOPQ+session/token=="


def _botocore(
    method: str, url: str, body: bytes, token: str | None, region: str, *, signed_payload: bool
) -> dict[str, str]:
    request = AWSRequest(method=method, url=url, data=body)
    request.context["client_config"] = Config(s3={"payload_signing_enabled": signed_payload})
    signer = botocore.auth.S3SigV4Auth(BotoCredentials(KEY_ID, SECRET, token), "s3", region)
    original = botocore.auth.get_current_datetime
    botocore.auth.get_current_datetime = lambda: NOW.replace(tzinfo=None)
    try:
        signer.add_auth(request)
    finally:
        botocore.auth.get_current_datetime = original
    return {name.lower(): value for name, value in request.headers.items()}


CASES = [
    ("PUT", "http://127.0.0.1:9000", "bucket", "files/file-abc", b'{"a": 1}\n', None, True),
    ("PUT", "https://s3.eu-central-1.amazonaws.com", "b", "p/files/x", b"x" * 1000, TOKEN, True),
    ("PUT", "https://minio.example", "bucket", "files/with space+plus", b"body", None, False),
    ("GET", "http://localhost:9000", "bucket", "batches/b1/lines/0000001-tok.json", b"", None, True),
    ("GET", "https://r2.example:8443", "bk", "prefix/ünïcode/ファイル", b"", TOKEN, True),
    ("HEAD", "http://127.0.0.1:5000", "bucket", "a/b/c/~tilde/%percent", b"", None, True),
    ("HEAD", "https://s3.amazonaws.com", "bucket", "sl/ash//double", b"", TOKEN, False),
    ("HEAD", "http://127.0.0.1:5000", "bucket", "", b"", None, True),  # the bucket itself
]


@pytest.mark.parametrize(("method", "endpoint", "bucket", "key", "body", "token", "signed"), CASES)
def test_headers_match_botocore(
    method: str, endpoint: str, bucket: str, key: str, body: bytes, token: str | None, signed: bool
) -> None:
    region = "eu-central-1"
    path = f"/{bucket}/{encode_path(key)}" if key else f"/{bucket}"
    payload = hashlib.sha256(body).hexdigest() if signed else UNSIGNED_PAYLOAD
    host = endpoint.split("://", 1)[1]
    ours = sign(
        method,
        host,
        path,
        credentials=Credentials(KEY_ID, SECRET, token),
        region=region,
        payload_sha256=payload,
        now=NOW,
    )
    theirs = _botocore(method, endpoint + path, body, token, region, signed_payload=signed)
    assert ours["authorization"] == theirs["authorization"]
    for name in ("x-amz-date", "x-amz-content-sha256", "x-amz-security-token"):
        assert ours.get(name) == theirs.get(name), name


def test_the_secret_never_shows_in_a_repr() -> None:
    credentials = Credentials(KEY_ID, SECRET, TOKEN)
    assert SECRET not in repr(credentials) and TOKEN not in repr(credentials)


@pytest.mark.parametrize(
    ("url", "path", "query"),
    [
        ("http://127.0.0.1:9000/bucket?location", "/bucket", "location="),  # the bucket's location
        ("https://bkt.s3.eu-central-1.amazonaws.com/files/a%20b", "/files/a%20b", ""),  # virtual-host style
    ],
)
def test_a_query_and_a_virtual_host_match_botocore(url: str, path: str, query: str) -> None:
    host = url.split("://", 1)[1].split("/", 1)[0]
    ours = sign(
        "GET",
        host,
        path,
        credentials=Credentials(KEY_ID, SECRET, TOKEN),
        region="eu-central-1",
        query=query,
        now=NOW,
    )
    theirs = _botocore("GET", url, b"", TOKEN, "eu-central-1", signed_payload=True)
    assert ours["authorization"] == theirs["authorization"]
