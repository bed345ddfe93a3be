"""The limited HTTP protocol in process, with a fake transport: what the sweeper closes, what it must not."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.http_limits import protocol_class, valid_traceparent
from gateway.settings import ConnectionLimits

TIMEOUT = 0.3
LIMITS = ConnectionLimits(header_timeout=TIMEOUT, body_timeout=TIMEOUT, keep_alive_timeout=TIMEOUT)
REQUEST = b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def write(self, data: Any) -> None:
        self.written += bytes(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.9", 5000), "sockname": ("127.0.0.1", 80)}.get(name, default)


def _connect(app: Any) -> tuple[Any, Transport]:
    cls = protocol_class(LIMITS)
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
