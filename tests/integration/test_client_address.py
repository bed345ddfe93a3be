"""The per-client connection cap behind a balancer, at the socket: the cap counts the client a trusted
balancer names (PROXY header, X-Forwarded-For), and a refused connection gets an answer it can read.

One gateway trusting 127.0.0.1 (the "balancer") with `max_per_client: 8`; direct clients use other
addresses of 127.0.0.0/8, so they are untrusted.
"""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import RecordingBackend, running_gateway

PER_CLIENT = 8
BALANCER = "127.0.0.1"
BODY = b'{"model":"echo-model","messages":[{"role":"user","content":"' + b"x" * 4000 + b'"}],"max_tokens":4}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
)


@dataclass
class Gateway:
    host: str
    port: int


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    workdir: Path = tmp_path_factory.mktemp("client-address")
    with RecordingBackend("echo-model") as recorder:
        config = {
            "pools": [
                {
                    "name": "rec",
                    "vendor": "amd",
                    "accelerator": "mi300x",
                    "price_per_gpu_hour": 1.0,
                    "backends": [{"url": recorder.url, "models": ["echo-model"], "max_model_len": 8192}],
                }
            ],
            "gateway": {
                "connections": {"max_per_client": PER_CLIENT, "keep_alive_timeout": 5.0},
                "trusted_proxies": [f"{BALANCER}/32"],
                "forwarded_for": True,
            },
            "telemetry": {"access_log": {"enabled": False}},
        }
        with running_gateway(config, workdir) as base:
            host, port = base.removeprefix("http://").split(":")
            yield Gateway(host, int(port))


def connect(gateway: Gateway, source: str) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect((gateway.host, gateway.port))
    return sock


def proxy_v1(client: str, port: int = 40000) -> bytes:
    return f"PROXY TCP4 {client} 127.0.0.1 {port} 8080\r\n".encode()


def proxy_v2(client: str, port: int = 40000) -> bytes:
    addresses = socket.inet_aton(client) + socket.inet_aton("127.0.0.1") + struct.pack("!HH", port, 8080)
    return b"\r\n\r\n\x00\r\nQUIT\n" + bytes([0x21, 0x11]) + struct.pack("!H", len(addresses)) + addresses


def read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One Content-Length framed response; status 0 if the connection closed first. A reset raises."""
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


def error_code(status: int, body: bytes, expected: int) -> str:
    assert status == expected, body
    return str(json.loads(body)["error"]["code"])


def refused_readably(gateway: Gateway, source: str, preamble: bytes) -> str:
    """Open a connection past the cap, send a request (headers and body in two writes, as httpx does) and
    read the answer; returns what happened."""
    with connect(gateway, source) as sock:
        try:
            sock.sendall(preamble + REQUEST[: -len(BODY)])
            sock.sendall(BODY)
            status, headers, body = read_response(sock)
        except (ConnectionResetError, BrokenPipeError):
            return "reset"
        if status != 429 or headers.get("connection") != "close":
            return f"status {status}"
        return error_code(status, body, 429)


@pytest.mark.parametrize(
    ("source", "client", "preamble"),
    [
        ("127.0.0.77", "127.0.0.77", b""),
        (BALANCER, "203.0.113.7", proxy_v2("203.0.113.7")),
        (BALANCER, "203.0.113.8", proxy_v1("203.0.113.8")),
    ],
    ids=["direct", "proxy-v2", "proxy-v1"],
)
def test_300_connections_past_a_clients_cap_get_readable_429s(
    gateway: Gateway, source: str, client: str, preamble: bytes
) -> None:
    held = []
    try:
        for _ in range(PER_CLIENT):
            sock = connect(gateway, source)
            sock.sendall(preamble)
            held.append(sock)
        with ThreadPoolExecutor(30) as pool:
            outcomes = list(pool.map(lambda _: refused_readably(gateway, source, preamble), range(300)))
        assert outcomes == ["too_many_connections"] * 300
        with connect(gateway, "127.0.0.78") as other:  # another client is not affected
            other.sendall(REQUEST)
            assert read_response(other)[0] == 200
    finally:
        for sock in held:
            sock.close()


def test_a_proxy_header_from_an_untrusted_address_is_refused(gateway: Gateway) -> None:
    for preamble in (proxy_v1("203.0.113.9"), proxy_v2("203.0.113.9")):
        with connect(gateway, "127.0.0.80") as sock:
            sock.sendall(preamble + REQUEST)
            status, _, body = read_response(sock)
            assert error_code(status, body, 400) == "invalid_http"
            assert sock.recv(1) == b""  # and closed


def test_a_malformed_proxy_header_from_the_balancer_is_refused(gateway: Gateway) -> None:
    unix_family = proxy_v2("203.0.113.9")[:13] + b"\x31"
    for preamble in (b"PROXY TCP4 203.0.113.9 127.0.0.1 99999 8080\r\n", unix_family):
        with connect(gateway, BALANCER) as sock:
            sock.sendall(preamble + REQUEST)
            status, _, body = read_response(sock)
            assert error_code(status, body, 400) == "invalid_proxy_header"
            assert sock.recv(1) == b""


def test_the_balancer_without_a_proxy_header_is_served_and_keeps_its_connection(gateway: Gateway) -> None:
    forwarded = REQUEST.replace(b"Host: gw\r\n", b"Host: gw\r\nX-Forwarded-For: 198.51.100.4\r\n")
    with connect(gateway, BALANCER) as sock:
        for _ in range(3):
            sock.sendall(forwarded)
            assert read_response(sock)[0] == 200


def test_counts_are_released_whatever_way_a_balancers_connection_ends(gateway: Gateway) -> None:
    client = "203.0.113.10"
    for ending in ("served", "truncated header", "closed after header", "garbage"):
        for _ in range(PER_CLIENT + 2):  # more than the cap, one after another: each must be released
            with connect(gateway, BALANCER) as sock:
                if ending == "served":
                    sock.sendall(proxy_v2(client) + REQUEST)
                    assert read_response(sock)[0] == 200
                elif ending == "truncated header":
                    sock.sendall(proxy_v2(client)[:20])
                elif ending == "closed after header":
                    sock.sendall(proxy_v1(client))
                else:
                    sock.sendall(b"\r\n\r\n\x00\r\nQUIT\n" + bytes(range(256)) * 4)
    held = []
    try:
        for _ in range(PER_CLIENT):  # nothing leaked: the client's whole allowance is there, kept alive
            sock = connect(gateway, BALANCER)
            held.append(sock)
            sock.sendall(proxy_v2(client) + REQUEST)
            assert read_response(sock)[0] == 200
        with connect(gateway, BALANCER) as sock:
            sock.sendall(proxy_v2(client) + REQUEST)
            status, _, body = read_response(sock)
            assert error_code(status, body, 429) == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
