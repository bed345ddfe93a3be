"""The connection caps, counted by the real client, with refusals the client can read.

`max_total` open connections (then 503) and `max_per_client` per client (then 429) are decided when a
connection is accepted. Who the client is (`gateway.trusted_proxies`, gateway/http/client_address.py):

- an untrusted peer is its own client. A PROXY header from it is not read: it is invalid HTTP (400);
- a trusted peer's connection may begin with a PROXY v1/v2 header (gateway/http/proxy_protocol.py;
  required with
  `proxy_protocol: required`, never read with `off`); the client it names is counted, at accept time as a
  direct client would be, and is the one the app sees (`scope["client"]`). LOCAL/UNKNOWN (a balancer's
  health check) counts against the balancer;
- a trusted peer's connection without one (an L7 ingress) carries many clients' requests: the connection is
  not counted, each request is, while in flight, against its X-Forwarded-For client (`forwarded_for`) or
  else the peer; past the cap that request gets 429 after its body is read, and the connection is kept.

A refused connection is not closed at once: its request is read and dropped (at most `_DRAIN_BYTES`,
`_DRAIN_SECONDS`), then the answer goes with `connection: close`, the gateway half-closes and discards what
still arrives until the client closes (at most `_LINGER_SECONDS`). Closing a socket with unread bytes in it
sends a reset, which destroys an answer the client has not read yet.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any, Literal

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.http.asgi_io import DISCONNECT_HOOK
from gateway.http.client_address import TrustedProxies
from gateway.http.proxy_protocol import ProxyHeaderError, read_header
from gateway.http.response_write import WRITABLE_HOOK

_DRAIN_BYTES = 1 << 20
_DRAIN_SECONDS = 1.0
_LINGER_SECONDS = 2.0
_LINGER_BYTES = 16 << 20
_XFF = b"x-forwarded-for"


@dataclass(frozen=True)
class CapAnswers:
    """The refusals, as whole HTTP responses (`connection: close`)."""

    too_many: bytes
    too_many_from_client: bytes
    too_many_requests_from_client: bytes
    proxy_header_required: bytes
    invalid_proxy_header: bytes


class ClientCounts:
    """Per client: its open connections, plus its requests in flight through a balancer's connection."""

    def __init__(
        self,
        max_total: int,
        max_per_client: int,
        trusted_proxies: TrustedProxies,
        proxy_protocol: Literal["off", "optional", "required"],
        forwarded_for: bool,
        answers: CapAnswers,
    ) -> None:
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.trusted = trusted_proxies
        self.reads_proxy_header = bool(trusted_proxies) and proxy_protocol != "off"
        self.requires_proxy_header = proxy_protocol == "required"
        self.forwarded_for = forwarded_for
        self.answers = answers
        self.counts: Counter[str] = Counter()
        body = answers.too_many_requests_from_client.partition(b"\r\n\r\n")[2]
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

        async def refuse_request(scope: Any, receive: Any, send: Any) -> None:
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})

        self.refuse_request = refuse_request
        """The app a request past its client's cap on a balancer's connection gets: read, then 429."""

    def admit(self, client: str) -> bool:
        if self.counts[client] >= self.max_per_client:
            return False
        self.counts[client] += 1
        return True

    def release(self, client: str) -> None:
        left = self.counts[client] - 1
        if left > 0:
            self.counts[client] = left
        else:
            del self.counts[client]


class _RequestEnd:
    """httptools callbacks for draining a refused connection's request: only its end matters."""

    __slots__ = ("complete",)

    def __init__(self) -> None:
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True


class ClientCapProtocol(HttpToolsProtocol):
    """uvicorn's protocol with the caps; `caps` is set on the subclass each server builds."""

    caps: ClientCounts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._address: str | None = None
        self._special = False
        """Set while data needs more than the HTTP parser: a PROXY header awaited, or a refusal."""
        self._awaiting_proxy = False
        self._proxy_buffer = b""
        self._per_request = False
        """A trusted balancer's connection without a PROXY header: each request counted by its client."""
        self._request_clients: deque[str | None] = deque()
        self._refusal = b""
        self._drain: httptools.HttpRequestParser | None = None
        self._drain_end = _RequestEnd()
        self._drained = 0
        self._answered = False
        self._timer: asyncio.TimerHandle | None = None
        setattr(self, WRITABLE_HOOK, None)

    # typeshed types the argument BaseTransport for every protocol; a TCP connection's is a Transport
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        caps = self.caps
        if len(self.connections) > caps.max_total:
            self._refuse(caps.answers.too_many)
            return
        address = self.client[0] if self.client else ""
        if caps.trusted and caps.trusted.trusts(address):
            if caps.reads_proxy_header:
                self._awaiting_proxy = self._special = True  # the idle timeout bounds the wait
            else:
                self._per_request = True
            return
        self._admit(address)

    def _admit(self, address: str) -> None:
        if self.caps.admit(address):
            self._address = address
        else:
            self._refuse(self.caps.answers.too_many_from_client)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._address is not None:
            self.caps.release(self._address)
            self._address = None
        while self._request_clients:
            counted = self._request_clients.popleft()
            if counted is not None:
                self.caps.release(counted)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        cycle = self.cycle
        super().connection_lost(exc)
        if cycle is not None and cycle.disconnected:
            lost = getattr(cycle, DISCONNECT_HOOK, None)
            if lost is not None:
                lost()  # the request's DisconnectWatch (gateway/http/asgi_io.py): cancel it

    def pause_writing(self) -> None:
        super().pause_writing()
        on_writable = getattr(self, WRITABLE_HOOK)
        if on_writable is not None:
            on_writable(False)  # a spliced relay stops reading its backend (gateway/request/relay.py)

    def resume_writing(self) -> None:
        super().resume_writing()
        on_writable = getattr(self, WRITABLE_HOOK)
        if on_writable is not None:
            on_writable(True)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        setattr(cycle, DISCONNECT_HOOK, None)  # this protocol tells the request when its client is gone
        super()._start_asgi_task(cycle, app)

    def eof_received(self) -> None:
        if self._refusal and not self._answered:
            self._answer_refusal()  # the client sent all it will: answer now; the transport then closes
        return None

    def _special_data(self, data: bytes) -> None:
        """What `data_received` does while `_special` is set."""
        if self._awaiting_proxy:
            self._proxy_header_received(data)
        elif self._refusal:
            self._drain_received(data)
        else:
            self._special = False
            self.data_received(data)

    # --- a trusted balancer's PROXY header --------------------------------------------------------

    def _proxy_header_received(self, data: bytes) -> None:
        buffer = self._proxy_buffer + data
        answers = self.caps.answers
        try:
            header = read_header(buffer)
        except ProxyHeaderError:
            self._awaiting_proxy = False
            self._refuse(answers.invalid_proxy_header)
            self._drain_received(buffer)
            return
        if header is None:
            self._proxy_buffer = buffer
            return
        self._awaiting_proxy = self._special = False
        self._proxy_buffer = b""
        if header.length == 0:  # no PROXY header
            if self.caps.requires_proxy_header:
                self._refuse(answers.proxy_header_required)
            else:
                self._per_request = True
        elif header.client is not None:
            self.client = header.client
            self._admit(header.client[0])
        else:  # LOCAL / UNKNOWN: the balancer's own connection (a health check)
            self._admit(self.client[0] if self.client else "")
        rest = buffer[header.length :]
        if rest:
            self.data_received(rest)

    # --- a balancer's connection: each request counted -------------------------------------------

    def _start_request(self) -> None:
        """uvicorn's on_headers_complete; on a balancer's connection the request is counted first."""
        if not self._per_request:
            HttpToolsProtocol.on_headers_complete(self)
            return
        caps = self.caps
        client = self.client[0] if self.client else ""
        if caps.forwarded_for:
            values = [v for n, v in self.headers if n == _XFF]
            if values:
                client = caps.trusted.forwarded_client(values, client)
                self.scope["client"] = (client, 0)
        if caps.admit(client):
            self._request_clients.append(client)
            HttpToolsProtocol.on_headers_complete(self)
            return
        self._request_clients.append(None)
        app, self.app = self.app, caps.refuse_request
        try:
            HttpToolsProtocol.on_headers_complete(self)
        finally:
            self.app = app

    def on_response_complete(self) -> None:
        self._release_request_client()
        super().on_response_complete()

    def _release_request_client(self) -> None:
        """The answered request's client (on a balancer's connection) is counted no more."""
        if self._request_clients:
            counted = self._request_clients.popleft()
            if counted is not None:
                self.caps.release(counted)

    # --- refusing a connection so that the client reads the answer -------------------------------

    def _refuse(self, response: bytes) -> None:
        """Answer `response` once the request has been read (bounded), then half-close and linger."""
        self._refused = self._special = True
        self._refusal = response
        self._drain = httptools.HttpRequestParser(self._drain_end)
        self._timer = self.loop.call_later(_DRAIN_SECONDS, self._answer_refusal)

    def _drain_received(self, data: bytes) -> None:
        self._drained += len(data)
        if self._answered:
            if self._drained > _DRAIN_BYTES + _LINGER_BYTES:
                self.transport.close()
            return
        drain = self._drain
        assert drain is not None  # set with the refusal, before any data is drained
        try:
            drain.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            pass  # not (plain) HTTP: answer it all the same
        else:
            if not self._drain_end.complete and self._drained <= _DRAIN_BYTES:
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
        transport.write(self._refusal)
        if transport.can_write_eof():
            transport.write_eof()
            self._timer = self.loop.call_later(_LINGER_SECONDS, transport.close)
        else:
            transport.close()
