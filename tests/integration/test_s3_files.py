"""gateway/batch/s3/files.py against a real S3-compatible server (moto's, on loopback, checking signatures).

What LocalFileStore promises, over HTTP: put, get, exists, overwrite, missing objects, a 20 MB object, names
with spaces, unicode and slashes under a prefix; then what an operator gets wrong: a missing bucket, a wrong
secret, a dead endpoint, each a clear error that carries no secret.
"""

from __future__ import annotations

import http.client
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import msgspec
import pytest

from gateway.batch.s3.files import S3FileStore, S3StoreError, credentials_from_env
from gateway.batch.s3.sigv4 import Credentials
from gateway.config.batches import S3Options
from tests.s3_server import REGION, S3Server, s3_server
from tests.support import free_port


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


@pytest.fixture(scope="module")
def bucket(s3: S3Server) -> str:
    name = f"switchyard-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=name)
    return name


def _options(s3: S3Server, bucket: str, **overrides: Any) -> S3Options:
    fields = {"endpoint": s3.endpoint, "bucket": bucket, "region": REGION, **overrides}
    return msgspec.convert(fields, S3Options)


@pytest.fixture
async def store(s3: S3Server, bucket: str) -> AsyncIterator[S3FileStore]:
    options = _options(s3, bucket, prefix="gw/test/")
    files = S3FileStore(options, credentials_from_env(options, s3.env))
    yield files
    await files.close()


async def test_put_get_exists_overwrite_and_missing(store: S3FileStore, s3: S3Server, bucket: str) -> None:
    name = "batches/b1/lines/0000001-tok.json"
    assert await store.get(name) is None
    assert not await store.exists(name)
    await store.put(name, b'{"a": 1}\n')
    assert await store.exists(name)
    assert await store.get(name) == b'{"a": 1}\n'
    await store.put(name, b"second")
    assert await store.get(name) == b"second"
    await store.put("files/empty", b"")
    assert await store.get("files/empty") == b""
    stored = s3.client().get_object(Bucket=bucket, Key="gw/test/" + name)["Body"].read()
    assert stored == b"second"  # under the prefix, the name as given


async def test_delete_removes_the_object_and_a_missing_one_is_no_error(
    store: S3FileStore, s3: S3Server, bucket: str
) -> None:
    await store.put("files/file-gone", b"x")
    await store.delete("files/file-gone")
    assert await store.get("files/file-gone") is None
    assert s3.client().list_objects_v2(Bucket=bucket, Prefix="gw/test/files/file-gone")["KeyCount"] == 0
    await store.delete("files/file-gone")


async def test_names_with_spaces_unicode_and_slashes(store: S3FileStore, s3: S3Server, bucket: str) -> None:
    for name in ("files/with space+plus", "files/ünïcode/ファイル", "a/b/c/~tilde/%percent&amp=1?q"):
        await store.put(name, name.encode())
        assert await store.get(name) == name.encode()
        assert await store.exists(name)
        assert s3.client().head_object(Bucket=bucket, Key="gw/test/" + name)["ContentLength"] == len(
            name.encode()
        )


@pytest.mark.parametrize("name", ["../escape", "files/../../x", "/absolute", "a//b", "./a", "", "a\nb"])
async def test_names_that_leave_the_store_are_refused(store: S3FileStore, name: str) -> None:
    with pytest.raises(ValueError):
        await store.put(name, b"x")


@pytest.mark.parametrize("sign_payload", [True, False])
async def test_a_20_mb_object(s3: S3Server, bucket: str, sign_payload: bool) -> None:
    options = _options(s3, bucket, sign_payload=sign_payload)
    store = S3FileStore(options, credentials_from_env(options, s3.env))
    data = uuid.uuid4().bytes * (20 * 1024 * 1024 // 16)
    try:
        started = time.monotonic()
        await store.put("files/large", data)
        assert await store.get("files/large") == data
        assert time.monotonic() - started < 30
    finally:
        await store.close()


async def test_a_missing_bucket_is_a_clear_error(s3: S3Server) -> None:
    options = _options(s3, "no-such-bucket")
    store = S3FileStore(options, credentials_from_env(options, s3.env))
    try:
        for call in (store.put("files/x", b"x"), store.get("files/x"), store.exists("files/x")):
            with pytest.raises(S3StoreError, match=r"bucket `no-such-bucket` at .* does not exist"):
                await call
    finally:
        await store.close()


@pytest.mark.parametrize("token", [None, "a-session-token"])
async def test_a_wrong_secret_is_a_clear_error_without_the_secret(
    s3: S3Server, bucket: str, token: str | None
) -> None:
    secret = "not-the-secret-" + uuid.uuid4().hex
    store = S3FileStore(_options(s3, bucket), Credentials(s3.access_key_id, secret, token))
    try:
        for call in (store.put("files/x", b"x"), store.get("files/x"), store.exists("files/x")):
            with pytest.raises(S3StoreError, match="access denied") as refused:
                await call
            assert secret not in str(refused.value) and "a-session-token" not in str(refused.value)
        assert secret not in repr(store) and secret not in repr(store._credentials)
    finally:
        await store.close()


async def test_a_dead_endpoint_is_tried_again_then_a_clear_error(bucket: str) -> None:
    options = msgspec.convert(
        {"endpoint": f"http://127.0.0.1:{free_port()}", "bucket": bucket, "retry_backoff_s": 0.01},
        S3Options,
    )
    store = S3FileStore(options, Credentials("AKID", "secret-value"))
    try:
        with pytest.raises(S3StoreError, match="failed 4 times, last: ClientConnectorError") as failed:
            await store.get("files/x")
        assert "secret-value" not in str(failed.value)
    finally:
        await store.close()


class _FlakyProxy:
    """In front of the S3 server: answers the next `failures` requests with 503 SlowDown, forwards the rest
    as they came (Host header included, so the signature still holds)."""

    def __init__(self, target: str) -> None:
        self.failures = 0
        self.requests = 0
        proxy = self
        upstream = urlsplit(target)

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                proxy.requests += 1
                if proxy.failures > 0:
                    proxy.failures -= 1
                    error = b"<Error><Code>SlowDown</Code></Error>"
                    self.send_response(503)
                    self.send_header("content-length", str(len(error)))
                    self.end_headers()
                    self.wfile.write(error)
                    return
                connection = http.client.HTTPConnection(upstream.hostname, upstream.port, timeout=30)
                connection.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    connection.putheader(name, value)
                connection.endheaders(body or None)
                answer = connection.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(name, value)
                self.send_header("content-length", str(len(data) if self.command != "HEAD" else 0))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                connection.close()

            do_GET = do_PUT = do_HEAD = _relay

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def test_5xx_answers_are_tried_again_then_a_clear_error(s3: S3Server, bucket: str) -> None:
    proxy = _FlakyProxy(s3.endpoint)
    options = msgspec.convert(
        {"endpoint": proxy.endpoint, "bucket": bucket, "region": REGION, "retry_backoff_s": 0.01}, S3Options
    )
    store = S3FileStore(options, credentials_from_env(options, s3.env))
    try:
        proxy.failures = 2
        await store.put("files/flaky", b"landed")  # twice 503, then the whole PUT again, newly signed
        assert proxy.requests == 3
        assert s3.client().get_object(Bucket=bucket, Key="files/flaky")["Body"].read() == b"landed"
        proxy.failures, proxy.requests = 10, 0
        with pytest.raises(S3StoreError, match="failed 4 times, last: HTTP 503 SlowDown"):
            await store.get("files/flaky")
        assert proxy.requests == 4
        proxy.failures = 0
        assert await store.get("files/flaky") == b"landed"
    finally:
        await store.close()
        proxy.close()


def test_credentials_come_from_the_variables_the_config_names() -> None:
    options = msgspec.convert(
        {"endpoint": "http://s3:9000", "bucket": "bkt", "access_key_id_env": "MY_KEY"}, S3Options
    )
    with pytest.raises(S3StoreError, match="set the environment variables MY_KEY and AWS_SECRET_ACCESS_KEY"):
        credentials_from_env(options, {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"})
    found = credentials_from_env(
        options, {"MY_KEY": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    )
    assert (found.access_key_id, found.secret_access_key, found.session_token) == ("k", "s", "t")
