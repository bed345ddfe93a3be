"""uvicorn's httptools protocol with the limits a gateway facing untrusted clients needs.

The limits are `gateway.connections` in the config file:

- Timeouts: an idle connection (new, or between requests) is closed after `keep_alive_timeout`; a request's
  headers must arrive within `header_timeout` of its first byte, its body within `body_timeout` of the end
  of its headers (then 408). A request pays nothing for this: one sweeper task per server looks at every
  connection a few times a second, reads where it is from uvicorn's own state (`_phase`) and closes those
  that stayed in one phase too long, at most two sweep intervals (a fifth of the timeout) late.
- Caps: `max_total` open connections (then 503) and `max_per_client` per client address (then 429),
  decided when the connection is accepted. A refused connection's request is read and dropped (at most
  `_DRAIN_BYTES`, `_DRAIN_SECONDS`) before the answer, sent with `connection: close`, and the gateway then
  half-closes and keeps discarding what still arrives until the client closes (at most `_LINGER_SECONDS`):
  closing a socket with unread bytes sends a reset, which loses the answer the client had not read yet.
- Behind a balancer (`gateway.trusted_proxies`, gateway/client_address.py): a trusted peer's connection
  may begin with a PROXY v1/v2 header (gateway/proxy_protocol.py); its client is then the one counted,
  at accept time as for a direct client, and the one the app sees (`scope["client"]`). A trusted peer's
  connection without one carries many clients' requests: it is not counted itself, each request is,
  against the X-Forwarded-For client (`forwarded_for`) or else the peer, while it is in flight (then 429
  for that request, the connection kept). An untrusted peer's PROXY header is just invalid HTTP (400).
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
from collections import Counter, deque
from collections.abc import Sequence
from typing import Any, Literal

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.client_address import TrustedProxies
from gateway.errors import GatewayError
from gateway.proxy_protocol import ProxyHeaderError, read_header
from gateway.settings import ConnectionLimits

_IDLE, _HEADERS, _BODY, _BUSY = 0, 1, 2, 3
_TRACEPARENT = b"traceparent"
_TRACESTATE = b"tracestate"
_TRACE_HEADERS = frozenset((_TRACEPARENT, _TRACESTATE))
# W3C Trace Context: version-traceid-parentid-flags, lowercase hex; version ff is invalid; a version above
# 00 may append fields after a dash.
_HEX_AND_DASH = b"0123456789abcdef-"
_ZERO_TRACE = b"0" * 32
_ZERO_SPAN = b"0" * 16
_DRAIN_BYTES = 1 << 20
"""A refused connection's request is read (and dropped) up to this much before the answer..."""
_DRAIN_SECONDS = 1.0
"""...or for this long, whichever ends first."""
_LINGER_SECONDS = 2.0
"""After the answer and a half-close, what still arrives is discarded until the client closes or this."""
_LINGER_BYTES = 16 << 20
_XFF = b"x-forwarded-for"


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


class _RequestEnd:
    """httptools callbacks for draining a refused connection's request: only its end matters."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True


def protocol_class(
    limits: ConnectionLimits,
    trusted_proxies: Sequence[str] = (),
    proxy_protocol: Literal["off", "optional", "required"] = "optional",
    forwarded_for: bool = False,
) -> type[HttpToolsProtocol]:
    """A protocol class bound to `limits` and the trusted balancers, with its own per-address counts and
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
    too_many_requests_from_client = _canned(
        429,
        f"Too many requests in flight from this address (the limit is {limits.max_per_client}).",
        "rate_limit_exceeded",
        "too_many_connections",
    )
    proxy_header_required = _canned(
        400,
        "This gateway expects a PROXY protocol header from this balancer (gateway.proxy_protocol: required).",
        "invalid_request_error",
        "proxy_header_required",
    )
    invalid_proxy_header = _canned(
        400, "Invalid PROXY protocol header.", "invalid_request_error", "invalid_proxy_header"
    )
    trusted = TrustedProxies(trusted_proxies)
    reads_proxy_header = bool(trusted) and proxy_protocol != "off"
    upgrade_refused = _canned(
        400,
        "Protocol upgrades (`Connection: Upgrade`) are not supported; send the request without them.",
        "invalid_request_error",
        "upgrade_not_supported",
    )
    per_client: Counter[str] = Counter()
    sweep_every = max(0.05, min(timeouts.values()) / 10)
    max_header_bytes = limits.max_header_bytes
    max_value_bytes = limits.max_header_value_bytes
    base = HttpToolsProtocol

    class LimitedHttpProtocol(HttpToolsProtocol):
        _sweeper: asyncio.Task[None] | None = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._address: str | None = None
            self._refused = False
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
            self._special = False
            """Set while data needs more than the HTTP parser: a PROXY header awaited, or a refusal."""
            self._awaiting_proxy = False
            self._proxy_buffer = b""
            self._per_request = False
            """A trusted balancer's connection without a PROXY header: each request counted by its client."""
            self._request_clients: deque[str | None] = deque()
            self._refusal: bytes | None = None
            self._drain: httptools.HttpRequestParser | None = None
            self._drain_end: _RequestEnd | None = None
            self._drained = 0
            self._answered = False
            self._timer: asyncio.TimerHandle | None = None

        # --- connections ----------------------------------------------------------------------------

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_total:
                self._refuse(too_many)
                return
            address = self.client[0] if self.client else ""
            if trusted and trusted.trusts(address):
                if reads_proxy_header:
                    self._awaiting_proxy = self._special = True  # the sweeper's idle timeout bounds the wait
                else:
                    self._per_request = True
                self._start_sweeper()
                return
            self._admit(address)

        def _admit(self, address: str) -> None:
            """Count the connection against its client, or refuse it past `max_per_client`."""
            if per_client[address] >= limits.max_per_client:
                self._refuse(too_many_from_client)
                return
            per_client[address] += 1
            self._address = address
            self._start_sweeper()

        def _start_sweeper(self) -> None:
            cls = type(self)
            if cls._sweeper is None:
                cls._sweeper = self.loop.create_task(_sweep(self.connections))

        def connection_lost(self, exc: Exception | None) -> None:
            address = self._address
            if address is not None:
                self._address = None
                _release(address)
            while self._request_clients:
                counted = self._request_clients.popleft()
                if counted is not None:
                    _release(counted)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            super().connection_lost(exc)

        def eof_received(self) -> bool | None:
            if self._refusal is not None and not self._answered:
                self._answer_refusal()  # the client sent all it will: answer now; the transport then closes
            return None

        # --- a trusted balancer's PROXY header ------------------------------------------------------

        def _proxy_header_received(self, data: bytes) -> None:
            buffer = self._proxy_buffer + data
            try:
                header = read_header(buffer)
            except ProxyHeaderError:
                self._awaiting_proxy = False
                self._refuse(invalid_proxy_header)
                self._drain_received(buffer)
                return
            if header is None:
                self._proxy_buffer = buffer
                return
            self._awaiting_proxy = self._special = False
            self._proxy_buffer = b""
            rest = buffer[header.length :]
            if header.length == 0:  # no PROXY header
                if proxy_protocol == "required":
                    self._refuse(proxy_header_required)
                else:
                    self._per_request = True
            elif header.client is not None:
                self.client = header.client
                self._admit(header.client[0])
            else:  # LOCAL / UNKNOWN: the balancer's own connection (a health check)
                self._admit(self.client[0] if self.client else "")
            if rest:
                self.data_received(rest)

        # --- refusing a connection so that the client reads the answer -------------------------------

        def _refuse(self, response: bytes) -> None:
            """Answer `response` once the request has been read (bounded), then half-close and linger."""
            self._refused = self._special = True
            self._refusal = response
            self._drain_end = _RequestEnd()
            self._drain = httptools.HttpRequestParser(self._drain_end)
            self._timer = self.loop.call_later(_DRAIN_SECONDS, self._answer_refusal)

        def _drain_received(self, data: bytes) -> None:
            self._drained += len(data)
            if self._answered:
                if self._drained > _DRAIN_BYTES + _LINGER_BYTES:
                    self.transport.close()
                return
            try:
                self._drain.feed_data(data)  # type: ignore[union-attr]
            except httptools.HttpParserError:
                pass  # not HTTP: answer it all the same
            except httptools.HttpParserUpgrade:
                pass
            else:
                if not self._drain_end.complete and self._drained <= _DRAIN_BYTES:  # type: ignore[union-attr]
                    return
            self._answer_refusal()

        def _answer_refusal(self) -> None:
            if self._answered:
                return
            self._answered = True
            if self._timer is not None:
                self._timer.cancel()
            transport = self.transport
            if transport.is_closing():
                return
            transport.write(self._refusal or b"")
            if transport.can_write_eof():
                transport.write_eof()
                self._timer = self.loop.call_later(_LINGER_SECONDS, transport.close)
            else:
                transport.close()

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
            if self._special:
                if self._awaiting_proxy:
                    self._proxy_header_received(data)
                    return
                if self._refusal is not None:
                    self._drain_received(data)
                    return
            self._unset_keepalive_if_required()
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
            if name == b"expect" and value.lower() == b"100-continue":
                self.expect_100_continue = True
            elif name in _TRACE_HEADERS:
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
            if self._per_request:
                self._count_request(headers)
                return
            base.on_headers_complete(self)

        def _count_request(self, headers: list[tuple[bytes, bytes]]) -> None:
            peer = self.client[0] if self.client else ""
            client = peer
            if forwarded_for:
                values = [v for n, v in headers if n == _XFF]
                if values:
                    client = trusted.forwarded_client(values, peer)
                    self.scope["client"] = (client, 0)
            if per_client[client] >= limits.max_per_client:
                self._request_clients.append(None)
                app, self.app = self.app, _refuse_request
                try:
                    base.on_headers_complete(self)
                finally:
                    self.app = app
                return
            per_client[client] += 1
            self._request_clients.append(client)
            base.on_headers_complete(self)

        def on_response_complete(self) -> None:
            if self._request_clients:
                counted = self._request_clients.popleft()
                if counted is not None:
                    _release(counted)
            base.on_response_complete(self)

        def on_message_complete(self) -> None:
            if self._upgrade_refused:
                return
            base.on_message_complete(self)

    def _release(address: str) -> None:
        left = per_client[address] - 1
        if left > 0:
            per_client[address] = left
        else:
            del per_client[address]

    refusal_body = too_many_requests_from_client.partition(b"\r\n\r\n")[2]
    refusal_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(refusal_body)).encode()),
    ]

    async def _refuse_request(scope: Any, receive: Any, send: Any) -> None:
        """A request past its client's cap on a balancer's connection: read to its end, then 429."""
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 429, "headers": refusal_headers})
        await send({"type": "http.response.body", "body": refusal_body})

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
