"""uvicorn's httptools protocol with the limits a gateway facing untrusted clients needs.

The limits are `gateway.connections` in the config file:

- Timeouts: an idle connection (new, or between requests) is closed after `keep_alive_timeout`; a request's
  headers must arrive within `header_timeout` of its first byte, its body within `body_timeout` of the end
  of its headers (then 408). A request pays nothing for this: one sweeper task per server looks at every
  connection a few times a second, reads where it is from uvicorn's own state (`_phase`) and closes those
  that stayed in one phase too long, at most two sweep intervals (a fifth of the timeout) late.
- Caps: `max_total` open connections (then 503) and `max_per_client` per client (then 429), the client
  being the one a trusted balancer names (PROXY header, X-Forwarded-For); the refusal is written once the
  request is read, so the client reads it (gateway/http/client_cap.py).
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
from collections.abc import Sequence
from typing import Any, Literal

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.config.settings import ConnectionLimits
from gateway.http.client_address import TrustedProxies
from gateway.http.client_cap import CapAnswers, ClientCapProtocol, ClientCounts
from gateway.openai.errors import GatewayError

_IDLE, _HEADERS, _BODY, _BUSY = 0, 1, 2, 3
_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
_TRACE_HEADERS = frozenset((_TRACEPARENT, _TRACESTATE))
_EXPECT = b"expect"
_NOTED_HEADERS = _TRACE_HEADERS | {_EXPECT}
"""The headers `on_header` does more with than keep."""
# W3C Trace Context: version-traceid-parentid-flags, lowercase hex; version ff is invalid; a version above
# 00 may append fields after a dash.
_HEX_AND_DASH = b"0123456789abcdef-"
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16


def valid_traceparent(value: bytes) -> bool:
    """W3C Trace Context: `version-traceid-parentid-flags` in lowercase hex, ids not all zero, version `ff`
    invalid; version 00 is exactly 55 characters, a later version may append `-...` (C-level checks only)."""
    size = len(value)
    if size < 55 or (size > 55 and (value.startswith(b"00") or value[55] != 45)):
        return False
    fields = value[:55]
    return (
        value[2] == 45
        and value[35] == 45
        and value[52] == 45
        and fields.count(b"-") == 3
        and not fields.translate(None, _HEX_AND_DASH)
        and not value.startswith(b"ff")
        and value[3:35] != _ZERO_TRACE
        and value[36:52] != _ZERO_SPAN
    )


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


def protocol_class(
    limits: ConnectionLimits,
    trusted_proxies: Sequence[str] = (),
    proxy_protocol: Literal["off", "optional", "required"] = "optional",
    forwarded_for: bool = False,
) -> type[HttpToolsProtocol]:
    """A protocol class bound to `limits` and the trusted balancers, with its own per-client counts and
    sweeper."""

    invalid_http = _canned(400, "Invalid HTTP request received.", "invalid_request_error", "invalid_http")
    timed_out = {
        _HEADERS: _canned(
            408,
            f"The request headers did not arrive within {limits.header_timeout:g} s.",
            "invalid_request_error",
            "request_timeout",
        ),
        _BODY: _canned(
            408,
            f"The request body did not arrive within {limits.body_timeout:g} s.",
            "invalid_request_error",
            "request_timeout",
        ),
    }
    timeouts = {_IDLE: limits.keep_alive_timeout, _HEADERS: limits.header_timeout, _BODY: limits.body_timeout}
    headers_too_large = _canned(
        431,
        f"Request headers are larger than the gateway's limits ({limits.max_header_bytes} bytes in all, "
        f"{limits.max_header_value_bytes} bytes per value).",
        "invalid_request_error",
        "headers_too_large",
    )
    per_client = f"from this address (the limit is {limits.max_per_client})."
    answers = CapAnswers(
        too_many=_canned(
            503,
            "The gateway has too many open connections; retry shortly.",
            "service_unavailable",
            "too_many_connections",
        ),
        too_many_from_client=_canned(
            429, f"Too many open connections {per_client}", "rate_limit_exceeded", "too_many_connections"
        ),
        too_many_requests_from_client=_canned(
            429, f"Too many requests in flight {per_client}", "rate_limit_exceeded", "too_many_connections"
        ),
        proxy_header_required=_canned(
            400,
            "This gateway expects a PROXY protocol header from this balancer (gateway.proxy_protocol).",
            "invalid_request_error",
            "proxy_header_required",
        ),
        invalid_proxy_header=_canned(
            400, "Invalid PROXY protocol header.", "invalid_request_error", "invalid_proxy_header"
        ),
    )
    counts = ClientCounts(
        limits.max_total,
        limits.max_per_client,
        TrustedProxies(trusted_proxies),
        proxy_protocol,
        forwarded_for,
        answers,
    )
    upgrade_refused = _canned(
        400,
        "Protocol upgrades (`Connection: Upgrade`) are not supported; send the request without them.",
        "invalid_request_error",
        "upgrade_not_supported",
    )
    sweep_every = max(0.05, min(timeouts.values()) / 10)
    max_header_bytes = limits.max_header_bytes
    max_value_bytes = limits.max_header_value_bytes
    base = HttpToolsProtocol

    class LimitedHttpProtocol(ClientCapProtocol):
        _sweeper: asyncio.Task[None] | None = None
        caps = counts

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._seen_phase = -1
            self._seen_request: object = None
            """What the sweeper last saw this connection doing (a phase and the request it concerns, held
            so that `is` compares it: an equal-looking later request is another request)..."""
            self._seen_since = 0.0
            """...and since when."""
            self._counted_scope: object = None
            self._received_bytes = 0
            self._big_read = False
            self._trace_headers = self._parents = 0
            self._parent = b""
            self._upgrade_refused = False

        # --- connections ----------------------------------------------------------------------------

        # typeshed types the argument BaseTransport for every protocol; a TCP connection's is a Transport
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            cls = type(self)
            if cls._sweeper is None and not self._refused:
                cls._sweeper = self.loop.create_task(_sweep(self.connections))

        def _phase(self) -> tuple[int, object]:
            """Where the connection is, read from uvicorn's state: on_message_begin makes a new `scope`,
            on_headers_complete a cycle holding it, on_message_complete clears `more_body`."""
            cycle, scope = self.cycle, self.scope
            if self.pipeline:  # a pipelined request waits, complete, for the one being served
                return _BUSY, cycle
            if cycle is None or cycle.scope is not scope:
                return (_IDLE, cycle) if scope is None else (_HEADERS, scope)
            if cycle.response_complete:
                return _IDLE, cycle
            if cycle.more_body and not cycle.response_started:
                return _BODY, cycle
            return _BUSY, cycle

        def sweep(self, now: float) -> None:
            if self._refused or self.transport.is_closing():
                return
            phase, request = self._phase()
            if phase != self._seen_phase or request is not self._seen_request:
                self._seen_phase, self._seen_request, self._seen_since = phase, request, now
                return
            if phase == _BUSY or now - self._seen_since < timeouts[phase]:
                return
            if phase == _IDLE:
                self.transport.close()
            else:
                self._answer_and_close(timed_out[phase])

        # --- reading: what uvicorn does, plus the header bounds and answers in OpenAI's shape ---------

        def data_received(self, data: bytes) -> None:
            if self._special:  # a PROXY header awaited, or a refused connection's request
                self._special_data(data)
                return
            if len(data) > max_header_bytes:
                self._big_read = True  # on_headers_complete sums the headers
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade:
                self._upgrade_requested()
                return
            except httptools.HttpParserError as exc:
                too_large = isinstance(exc.__context__, HeaderTooLarge)
                self._answer_and_close(headers_too_large if too_large else invalid_http)
                return
            scope, cycle = self.scope, self.cycle
            if scope is not None and (cycle is None or cycle.scope is not scope):  # headers incomplete
                if scope is not self._counted_scope:
                    self._counted_scope, self._received_bytes = scope, 0
                self._received_bytes += len(data)
                if self._received_bytes > max_header_bytes:
                    self._answer_and_close(headers_too_large)

        def _upgrade_requested(self) -> None:
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.keep_alive = False  # served as a plain request, then closed
            elif not self.transport.is_closing():
                self.transport.close()

        def _answer_and_close(self, response: bytes) -> None:
            self._refused = True
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                if cycle.response_started:
                    self.transport.close()
                    return
                cycle.disconnected = True
                cycle.message_event.set()
            if not self.transport.is_closing():
                self.transport.write(response)
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            self._answer_and_close(invalid_http)

        def on_header(self, name: bytes, value: bytes) -> None:
            if len(value) > max_value_bytes:
                raise HeaderTooLarge
            name = name.lower()
            if name in _NOTED_HEADERS:  # one set test for the rest (an SDK sends fifteen or so)
                if name == _EXPECT:
                    if value.lower() == b"100-continue":
                        self.expect_100_continue = True
                else:
                    self._trace_headers += 1
                    if name == _TRACEPARENT:
                        self._parents += 1
                        self._parent = value
            self.headers.append((name, value))

        def on_headers_complete(self) -> None:
            headers = self.headers
            if self._big_read:
                self._big_read = False
                if sum(len(n) + len(v) for n, v in headers) > max_header_bytes:
                    raise HeaderTooLarge
            if self._trace_headers:
                # W3C: exactly one valid traceparent, or it and tracestate are dropped (a new trace starts)
                if self._parents != 1 or not valid_traceparent(self._parent):
                    headers[:] = [(n, v) for n, v in headers if n not in _TRACE_HEADERS]
                self._trace_headers = self._parents = 0
            if self.parser.should_upgrade() and _has_body(headers):
                self._upgrade_refused = True
                self._answer_and_close(upgrade_refused)
                return
            self._start_request()

        def on_message_complete(self) -> None:
            if self._upgrade_refused:
                return
            base.on_message_complete(self)

        def on_response_complete(self) -> None:
            """uvicorn's, less its keep-alive timer (a `call_later` and a `cancel` per request, and a
            check on every read): the sweeper closes a connection idle for `keep_alive_timeout`."""
            self._release_request_client()
            self.server_state.total_requests += 1
            if self.transport.is_closing():
                return
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)

    async def _sweep(connections: set[Any]) -> None:
        loop = asyncio.get_running_loop()
        try:
            while connections:
                await asyncio.sleep(sweep_every)
                now = loop.time()
                for connection in list(connections):
                    sweep = getattr(connection, "sweep", None)
                    if sweep is not None:
                        sweep(now)
        finally:
            LimitedHttpProtocol._sweeper = None

    return LimitedHttpProtocol


def _has_body(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value.strip(b" 0")):
            return True
    return False
