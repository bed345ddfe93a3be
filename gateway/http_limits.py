"""uvicorn's httptools protocol with the limits a gateway facing untrusted clients needs.

The limits are `gateway.connections` in the config file:

- Timeouts: an idle connection (new, or between requests) is closed after `keep_alive_timeout`; a request's
  headers must arrive within `header_timeout` of its first byte, its body within `body_timeout` of the end
  of its headers (then 408). One sweeper task per server checks every connection's deadline a few times a
  second, so a request pays a few attribute writes, not a timer.
- Caps: `max_total` open connections (then 503) and `max_per_client` per client address (then 429); the
  answer is written at once and the connection closed.
- Header sizes: the request line plus headers past `max_header_bytes`, or one header value past
  `max_header_value_bytes`, get 431 (counted as bytes arrive, so a huge header is never buffered whole).
- An invalid W3C `traceparent` is dropped with its `tracestate` before the app sees the headers.
- What the HTTP parser refuses gets a 400 in OpenAI's JSON shape, not uvicorn's text/plain.
- The gateway speaks no websocket (uvicorn runs with `ws="none"`): an `Upgrade` request without a body
  (curl's h2c probe) is served as plain HTTP and the connection closed after it; one with a body (which
  the parser would not read) gets 400 `upgrade_not_supported`.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import GatewayError
from gateway.settings import ConnectionLimits

_IDLE, _HEADERS, _BODY, _BUSY = 0, 1, 2, 3
_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
# W3C Trace Context: version-traceid-parentid-flags, lowercase hex; version ff is invalid; a version above
# 00 may append fields after a dash.
_TRACEPARENT_RE = re.compile(rb"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16


def valid_traceparent(value: bytes) -> bool:
    match = _TRACEPARENT_RE.match(value)
    if match is None:
        return False
    version, trace_id, span_id, _flags, rest = match.groups()
    if version == b"ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return False
    return rest is None if version == b"00" else True


class HeaderTooLarge(Exception):
    pass


def _error_response(error: GatewayError) -> bytes:
    body = error.to_json()
    return b"".join(
        [
            STATUS_LINE[error.status],
            b"content-type: application/json\r\ncontent-length: ",
            str(len(body)).encode(),
            b"\r\nconnection: close\r\n\r\n",
            body,
        ]
    )


def _canned(status: int, message: str, type: str, code: str) -> bytes:
    return _error_response(GatewayError(status, message, type, code=code))


def protocol_class(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """A protocol class bound to `limits`, with its own per-address counts and sweeper."""

    invalid_http = _canned(400, "Invalid HTTP request received.", "invalid_request_error", "invalid_http")
    header_timeout = _canned(
        408,
        f"The request headers did not arrive within {limits.header_timeout:g} s.",
        "invalid_request_error",
        "request_timeout",
    )
    body_timeout = _canned(
        408,
        f"The request body did not arrive within {limits.body_timeout:g} s.",
        "invalid_request_error",
        "request_timeout",
    )
    headers_too_large = _canned(
        431,
        f"Request headers are larger than the gateway's limits ({limits.max_header_bytes} bytes in all, "
        f"{limits.max_header_value_bytes} bytes per value).",
        "invalid_request_error",
        "headers_too_large",
    )
    too_many = _canned(
        503,
        "The gateway has too many open connections; retry shortly.",
        "service_unavailable",
        "too_many_connections",
    )
    too_many_from_client = _canned(
        429,
        f"Too many open connections from this address (the limit is {limits.max_per_client}).",
        "rate_limit_exceeded",
        "too_many_connections",
    )
    upgrade_refused = _canned(
        400,
        "Protocol upgrades (`Connection: Upgrade`) are not supported; send the request without them.",
        "invalid_request_error",
        "upgrade_not_supported",
    )
    per_client: Counter[str] = Counter()
    sweep_every = max(0.05, min(limits.header_timeout, limits.body_timeout, limits.keep_alive_timeout) / 10)

    class LimitedHttpProtocol(HttpToolsProtocol):
        _sweeper: asyncio.Task[None] | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._phase = _IDLE
            self._deadline = math.inf
            self._header_bytes = 0
            self._received_bytes = 0
            self._address: str | None = None
            self._traceparent = False
            self._upgrade_refused = False

        # --- connections ----------------------------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._deadline = self.loop.time() + limits.keep_alive_timeout
            address = self.client[0] if self.client else ""
            if len(self.connections) > limits.max_total:
                self._refuse(too_many)
                return
            if per_client[address] >= limits.max_per_client:
                self._refuse(too_many_from_client)
                return
            per_client[address] += 1
            self._address = address
            cls = type(self)
            if cls._sweeper is None:
                cls._sweeper = self.loop.create_task(_sweep(self.connections))

        def _refuse(self, response: bytes) -> None:
            self._phase = _BUSY
            self.transport.write(response)
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            address = self._address
            if address is not None:
                self._address = None
                left = per_client[address] - 1
                if left > 0:
                    per_client[address] = left
                else:
                    del per_client[address]
            super().connection_lost(exc)

        # --- reading --------------------------------------------------------------------------------

        def data_received(self, data: bytes) -> None:
            self._unset_keepalive_if_required()
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._upgrade_requested()
                return
            except httptools.HttpParserError as exc:
                too_large = isinstance(exc.__context__, HeaderTooLarge)
                self._answer_and_close(headers_too_large if too_large else invalid_http)
                return
            if self._phase == _HEADERS:  # bytes buffered by the parser for headers not yet complete
                self._received_bytes += len(data)
                if self._received_bytes > limits.max_header_bytes:
                    self._answer_and_close(headers_too_large)

        def _upgrade_requested(self) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False  # served as a plain request, then closed
            elif not self.transport.is_closing():
                self.transport.close()

        def _answer_and_close(self, response: bytes) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:
                    self.transport.close()
                    return
                cycle.disconnected = True
                cycle.message_event.set()
            self._phase = _BUSY
            if not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._answer_and_close(invalid_http)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._phase = _HEADERS
            self._deadline = self.loop.time() + limits.header_timeout
            self._header_bytes = 0
            self._received_bytes = 0
            self._traceparent = False
            self._upgrade_refused = False

        def on_header(self, name: bytes, value: bytes) -> None:
            size = self._header_bytes + len(name) + len(value) + 4
            if len(value) > limits.max_header_value_bytes or size > limits.max_header_bytes:
                raise HeaderTooLarge
            self._header_bytes = size
            name = name.lower()
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            elif name in (_TRACEPARENT, _TRACESTATE):
                self._traceparent = True
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            if self._traceparent:
                _drop_invalid_traceparent(self.headers)
            if self.parser.should_upgrade() and _has_body(self.headers):
                self._upgrade_refused = True
                self._answer_and_close(upgrade_refused)
                return
            self._phase = _BODY
            self._deadline = self.loop.time() + limits.body_timeout
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            if self._upgrade_refused:
                return
            self._phase = _BUSY
            self._deadline = math.inf
            super().on_message_complete()

        def on_response_complete(self) -> None:
            if self._phase == _BUSY:
                self._phase = _IDLE
                self._deadline = self.loop.time() + limits.keep_alive_timeout
            super().on_response_complete()

        def expire(self, now: float) -> None:
            if now < self._deadline or self.transport.is_closing():
                return
            phase = self._phase
            if phase == _HEADERS:
                self._answer_and_close(header_timeout)
            elif phase == _BODY:
                self._answer_and_close(body_timeout)
            else:
                self._phase = _BUSY
                self._deadline = math.inf
                self.transport.close()

    async def _sweep(connections: set[Any]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while connections:
                await asyncio.sleep(sweep_every)
                now = loop.time()
                for connection in list(connections):
                    expire = getattr(connection, "expire", None)
                    if expire is not None:
                        expire(now)
        finally:
            LimitedHttpProtocol._sweeper = None

    return LimitedHttpProtocol


def _drop_invalid_traceparent(headers: list[tuple[bytes, bytes]]) -> None:
    """W3C: one valid traceparent or none; without a valid one, tracestate is dropped too."""
    parents = [value for name, value in headers if name == _TRACEPARENT]
    if len(parents) == 1 and valid_traceparent(parents[0]):
        return
    headers[:] = [(n, v) for n, v in headers if n not in (_TRACEPARENT, _TRACESTATE)]


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b" 0")):
            return True
    return False
