"""Hostile HTTP at the socket: timeouts, connection caps, header sizes, upgrades, parser rejections.

One gateway with short connection timeouts in front of a recording backend; clients speak raw HTTP over
sockets so that nothing in between fixes up what they send. A connection's client address is varied over
127.0.0.0/8 where a test must not count against another's per-address cap.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import RecordingBackend, running_gateway

# measures time or capacity on the whole machine: `make test` runs it by itself (pyproject.toml)
pytestmark = pytest.mark.alone

HEADER_TIMEOUT = 1.0
BODY_TIMEOUT = 1.5
KEEP_ALIVE = 1.0
PER_CLIENT = 8
BODY = b'{"model":"echo-model","messages":[{"role":"user","content":"hello"}],"max_tokens":4}'


@dataclass
class Gateway:
    host: str
    port: int
    recorder: RecordingBackend
    workdir: Path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir = tmp_path_factory.mktemp("hostile-http")
    with RecordingBackend("echo-model") as recorder:
        config = {
            "pools": [
                {
                    "name": "rec",
                    "vendor": "amd",
                    "accelerator": "mi300x",
                    "price_per_gpu_hour": 1.0,
                    "backends": [{"url": recorder.url, "models": ["echo-model"], "max_model_len": 4096}],
                }
            ],
            "gateway": {
                "connections": {
                    "header_timeout": HEADER_TIMEOUT,
                    "body_timeout": BODY_TIMEOUT,
                    "keep_alive_timeout": KEEP_ALIVE,
                    "max_per_client": PER_CLIENT,
                    "max_header_bytes": 16384,
                    "max_header_value_bytes": 4096,
                }
            },
            "telemetry": {"access_log": {"enabled": False}},
        }
        with running_gateway(config, workdir) as base:
            host, port = base.removeprefix("http://").split(":")
            yield Gateway(host, int(port), recorder, workdir)


_next_source = iter(range(2, 250))


def connect(gateway: Gateway, source: str | None = None) -> socket.socket:
    sock = socket.socket()
    sock.bind((source or f"127.0.0.{next(_next_source)}", 0))
    sock.settimeout(10)
    sock.connect((gateway.host, gateway.port))
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response (Content-Length framed); status 0 if the connection closed without one."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0, {}, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), headers, body


def closed_by_peer(sock: socket.socket, within: float) -> float | None:
    """Seconds until the gateway closed the connection (reading and discarding), None if it did not."""
    start = time.monotonic()
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def assert_openai_error(
    status: int, headers: dict[str, str], body: bytes, expected: int
) -> dict[str, object]:
    assert status == expected, body
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def post(path: str = "/v1/chat/completions", body: bytes = BODY, extra: bytes = b"") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + extra
        + b"\r\n"
        + body
    )


def test_a_websocket_upgrade_post_gets_an_answer(gateway: Gateway) -> None:
    with connect(gateway) as sock:
        sock.sendall(post(extra=b"Connection: Upgrade\r\nUpgrade: websocket\r\n"))
        status, headers, body = read_response(sock)
        assert assert_openai_error(status, headers, body, 400)["code"] == "upgrade_not_supported"
        assert closed_by_peer(sock, 3) is not None
    with connect(gateway) as sock:
        sock.sendall(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        status, _, _ = read_response(sock)
        assert status == 200
        assert closed_by_peer(sock, 3) is not None


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"GARBAGE\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v1/chat/completions HTTP/9.9\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nBad Header: x\r\n\r\n",
        b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
    ],
)
def test_parser_rejections_answer_in_openai_shape(gateway: Gateway, request_bytes: bytes) -> None:
    with connect(gateway) as sock:
        sock.sendall(request_bytes)
        status, headers, body = read_response(sock)
    error = assert_openai_error(status, headers, body, 400)
    assert error["code"] == "invalid_http"


def test_slowloris_headers_get_408_within_the_header_timeout(gateway: Gateway) -> None:
    with connect(gateway) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        for i in range(3):
            time.sleep(HEADER_TIMEOUT / 3)
            try:
                sock.sendall(f"X-Slow-{i}: 1\r\n".encode())
            except OSError:
                break
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - started
    assert assert_openai_error(status, headers, body, 408)["code"] == "request_timeout"
    assert HEADER_TIMEOUT * 0.8 < elapsed < HEADER_TIMEOUT + 1.0


def test_a_slow_body_gets_408_and_is_not_forwarded(gateway: Gateway) -> None:
    before = len(gateway.recorder.requests)
    with connect(gateway) as sock:
        sock.sendall(post()[: -len(BODY) + 10])
        started = time.monotonic()
        status, headers, body = read_response(sock)
        elapsed = time.monotonic() - started
    assert assert_openai_error(status, headers, body, 408)["code"] == "request_timeout"
    assert BODY_TIMEOUT * 0.8 < elapsed < BODY_TIMEOUT + 1.0
    assert len(gateway.recorder.requests) == before


def test_idle_connections_are_closed(gateway: Gateway) -> None:
    with connect(gateway) as fresh, connect(gateway) as used:
        used.sendall(post())
        assert read_response(used)[0] == 200
        for sock in (fresh, used):
            waited = closed_by_peer(sock, KEEP_ALIVE + 2)
            assert waited is not None and waited < KEEP_ALIVE + 1.0


def test_keep_alive_still_serves_request_after_request(gateway: Gateway) -> None:
    with connect(gateway) as sock:
        for _ in range(3):
            sock.sendall(post())
            assert read_response(sock)[0] == 200
            time.sleep(KEEP_ALIVE / 3)


def test_connections_per_client_address_are_capped(gateway: Gateway) -> None:
    source = "127.0.0.251"
    held = [connect(gateway, source) for _ in range(PER_CLIENT)]
    try:
        with connect(gateway, source) as extra:
            status, headers, body = read_response(extra)
            assert assert_openai_error(status, headers, body, 429)["code"] == "too_many_connections"
        with connect(gateway) as other:  # another address is not affected
            other.sendall(post())
            assert read_response(other)[0] == 200
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    with connect(gateway, source) as again:
        again.sendall(post())
        assert read_response(again)[0] == 200


@pytest.mark.parametrize(
    "extra",
    [
        b"X-Request-Id: " + b"a" * 5000 + b"\r\n",
        b"Traceparent: " + b"0" * 1_000_000 + b"\r\n",
        b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000) for i in range(20)),
    ],
)
def test_oversized_headers_get_431(gateway: Gateway, extra: bytes) -> None:
    before = len(gateway.recorder.requests)
    with connect(gateway) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(post(extra=extra))
        status, headers, body = read_response(sock)
    assert assert_openai_error(status, headers, body, 431)["code"] == "headers_too_large"
    assert len(gateway.recorder.requests) == before


VALID_PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.mark.parametrize(
    ("traceparent", "kept"),
    [
        (VALID_PARENT, True),
        ("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", True),
        (VALID_PARENT + "-extra", False),
        (VALID_PARENT.upper(), False),
        ("00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        ("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", False),
        ("x" * 3000, False),
    ],
)
def test_an_invalid_traceparent_is_dropped_with_its_tracestate(
    gateway: Gateway, traceparent: str, kept: bool
) -> None:
    with connect(gateway) as sock:
        sock.sendall(post(extra=f"Traceparent: {traceparent}\r\nTracestate: k=v\r\n".encode()))
        assert read_response(sock)[0] == 200
    _, headers, _ = gateway.recorder.requests[-1]
    forwarded = {k.lower(): v for k, v in headers.items()}
    if kept:
        assert forwarded.get("traceparent") == traceparent
        assert forwarded.get("tracestate") == "k=v"
    else:
        assert "traceparent" not in forwarded
        assert "tracestate" not in forwarded
