"""The limited HTTP protocol in process, with a fake transport: what the sweeper closes, what it must not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.config.settings import ConnectionLimits
from gateway.http.limits import protocol_class, valid_traceparent

TIMEOUT = 0.3
LIMITS = ConnectionLimits(header_timeout=TIMEOUT, body_timeout=TIMEOUT, keep_alive_timeout=TIMEOUT)
REQUEST = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False
        self.eof = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.9", 5000), "sockname": ("127.0.0.1", 80)}.get(name, default)


def _connect(app: Any, cls: Any = None) -> tuple[Any, Transport]:
    cls = cls or protocol_class(LIMITS)
    protocol = cls(uvicorn.Config(app, http=cls, ws="none", lifespan="off"), ServerState(), {})
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport


async def _slow_app(scope: Any, receive: Any, send: Any) -> None:
    await receive()
    await asyncio.sleep(TIMEOUT * 4)  # the backend takes longer than every connection timeout
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_a_request_being_served_is_never_timed_out() -> None:
    protocol, transport = _connect(_slow_app)
    protocol.data_received(REQUEST)
    await asyncio.sleep(TIMEOUT * 5)
    assert transport.written.startswith(b"HTTP/1.1 200")
    assert not transport.closed
    assert protocol.timeout_keep_alive_task is None  # no timer per request: the sweeper closes idle ones
    await asyncio.sleep(TIMEOUT * 2.5)  # then idle: closed after keep_alive_timeout
    assert transport.closed
    protocol.connection_lost(None)


async def test_a_pipelined_request_waits_for_the_one_being_served() -> None:
    protocol, transport = _connect(_slow_app)
    protocol.data_received(REQUEST + REQUEST)
    await asyncio.sleep(TIMEOUT * 10)
    assert transport.written.count(b"HTTP/1.1 200") == 2
    protocol.connection_lost(None)


async def test_headers_that_never_end_get_408() -> None:
    protocol, transport = _connect(_slow_app)
    protocol.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\n")
    await asyncio.sleep(TIMEOUT * 2)
    for _ in range(3):
        if transport.closed:
            break
        protocol.data_received(b"X-More: 1\r\n")
        await asyncio.sleep(TIMEOUT / 2)
    assert transport.closed
    assert transport.written.startswith(b"HTTP/1.1 408")
    assert b'"code":"request_timeout"' in transport.written
    protocol.connection_lost(None)


@pytest.mark.parametrize(
    ("value", "valid"),
    [
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        (b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds", True),
        (b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", True),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", False),
        (b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", False),
        (b"00-00000000000000000000000000000000-00f067aa0ba902b7-01", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", False),
        (b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", False),
        (b"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e47-36-00f067aa0ba902b7-01", False),
        (b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g", False),
        (b"", False),
    ],
)
def test_traceparent_validation(value: bytes, valid: bool) -> None:
    assert valid_traceparent(value) is valid


# --- behind a trusted balancer (the fake transport's peer is 127.0.0.9) ------------------------------------

BALANCED = ConnectionLimits(
    header_timeout=TIMEOUT, body_timeout=TIMEOUT, keep_alive_timeout=TIMEOUT * 10, max_per_client=2
)


def _forwarded(client: bytes) -> bytes:
    return REQUEST.replace(b"Host: x\r\n", b"Host: x\r\nX-Forwarded-For: " + client + b"\r\n")


async def test_a_refused_connection_is_answered_after_its_request_then_half_closed() -> None:
    cls = protocol_class(BALANCED)
    held = [_connect(_slow_app, cls) for _ in range(2)]
    protocol, transport = _connect(_slow_app, cls)
    protocol.data_received(REQUEST[:20])
    assert transport.written == b""  # the request is read first...
    protocol.data_received(REQUEST[20:])
    assert transport.written.startswith(b"HTTP/1.1 429") and b"connection: close" in transport.written
    assert transport.eof and not transport.closed  # ...then half-closed, lingering for the client's close
    protocol.data_received(b"late bytes are dropped")
    assert transport.written.count(b"HTTP/1.1") == 1
    protocol.eof_received()
    protocol.connection_lost(None)
    silent, quiet = _connect(_slow_app, cls)  # a client that sends nothing is answered within a second
    await asyncio.sleep(1.2)
    assert quiet.written.startswith(b"HTTP/1.1 429") and quiet.eof
    silent.connection_lost(None)
    for other, _ in held:
        other.connection_lost(None)


async def test_requests_through_a_balancer_are_counted_by_their_forwarded_client() -> None:
    cls = protocol_class(BALANCED, ["127.0.0.9/32"], "off", forwarded_for=True)
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"])
        await _slow_app(scope, receive, send)

    connections = [_connect(app, cls) for _ in range(4)]
    for protocol, _ in connections[:3]:
        protocol.data_received(_forwarded(b"6.6.6.6, 198.51.100.1"))  # 3 > max_per_client from one client
    connections[3][0].data_received(_forwarded(b"198.51.100.2"))
    await asyncio.sleep(0.05)
    refused = connections[2][1]
    assert refused.written.startswith(b"HTTP/1.1 429") and b"too_many_connections" in refused.written
    assert not refused.closed  # the balancer's connection carries other clients: kept
    assert seen == [("198.51.100.1", 0)] * 2 + [("198.51.100.2", 0)]
    await asyncio.sleep(TIMEOUT * 5)
    assert all(t.written.endswith(b"ok") for _, t in connections[:2] + connections[3:])
    connections[2][0].data_received(_forwarded(b"198.51.100.1"))  # the first two done: room again
    await asyncio.sleep(TIMEOUT * 5)
    assert refused.written.count(b"HTTP/1.1 200") == 1
    for protocol, _ in connections:
        protocol.connection_lost(None)


async def test_a_proxy_header_sets_the_client_and_its_count() -> None:
    cls = protocol_class(BALANCED, ["127.0.0.9/32"], "required")
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["client"])
        await _slow_app(scope, receive, send)

    connections = [_connect(app, cls) for _ in range(3)]
    for protocol, _ in connections:
        header = b"PROXY TCP4 198.51.100.1 10.0.0.1 4000 80\r\n"
        protocol.data_received(header[:9])  # a header may arrive in pieces
        protocol.data_received(header[9:] + REQUEST)
    await asyncio.sleep(0.05)
    assert seen == [("198.51.100.1", 4000)] * 2
    assert connections[2][1].written.startswith(b"HTTP/1.1 429")
    bare, transport = _connect(app, cls)  # required: the balancer must send one
    bare.data_received(REQUEST)
    assert transport.written.startswith(b"HTTP/1.1 400") and b"proxy_header_required" in transport.written
    for protocol, _ in [*connections, (bare, transport)]:
        protocol.connection_lost(None)


async def test_a_proxy_header_that_never_ends_is_closed_after_the_idle_timeout() -> None:
    cls = protocol_class(LIMITS, ["127.0.0.9/32"], "required")
    protocol, transport = _connect(_slow_app, cls)
    protocol.data_received(b"PROXY TCP4 198.51.100.1 ")
    await asyncio.sleep(TIMEOUT * 3)
    assert transport.closed and transport.written == b""
    protocol.connection_lost(None)
