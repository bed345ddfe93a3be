"""One keep-alive HTTP/1.1 connection to a backend (an asyncio protocol, answers parsed by httptools), and
the errors an exchange with a backend can end in. Pooled and used by gateway/upstream/client.py."""

from __future__ import annotations

import asyncio
from typing import Protocol

import httptools

_READ_HIGH_WATER = 256 * 1024
"""Buffered answer bytes above which the socket stops being read until the relay catches up."""

MAX_HEAD_BYTES = 64 * 1024
"""An answer's status line and headers past this without their end: the backend is broken (vLLM's are a
few hundred bytes), and what it sent is not kept growing until the attempt times out."""


class ConnectionOwner(Protocol):
    """What a connection tells the pool it belongs to (gateway/upstream/client.py `Pool`)."""

    def forget(self, conn: Connection) -> None: ...

    def put_back(self, conn: Connection) -> None: ...


class BodySink(Protocol):
    """Takes an answer's body as it is parsed, in the connection's own callback (`Connection.splice`)."""

    def received(self, data: bytes, complete: bool) -> None:
        """Body bytes arrived (possibly empty when `complete`); `complete`: the answer ends with them.
        Must not raise."""
        ...

    def failed(self, error: UpstreamError) -> None:
        """The answer broke before its end (the connection dropped or sent something not HTTP). Must not
        raise."""
        ...


def head_of(pieces: list[bytes]) -> bytes:
    """An answer's status line and header lines (each ending in CRLF), from what was read until httptools
    found the head complete (`Connection.head`): httptools validated them, so a header is then looked up
    in these bytes when asked for, rather than with one Python call per header as it is parsed."""
    raw = pieces[0] if len(pieces) == 1 else b"".join(pieces)
    end = raw.find(b"\r\n\r\n")
    return raw[: end + 2] if end >= 0 else raw


def header_in(head: bytes, lowered: bytes, name: str) -> str | None:
    """The value of header `name` (lower case) in `head` (`head_of`; `lowered`: the same, lower-cased),
    OWS stripped; the last one when it repeats, as a dict of the headers would keep it."""
    key = b"\r\n" + name.encode("latin-1") + b":"
    at = lowered.rfind(key)
    if at < 0:
        return None
    start = at + len(key)
    return head[start : head.find(b"\r\n", start)].strip(b" \t").decode("latin-1")


class UpstreamError(Exception):
    """The exchange with a backend failed before a complete answer."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or the name does not resolve."""


class ConnectTimeout(UpstreamError):
    """No connection within the connect timeout."""


class ConnectionBroken(UpstreamError):
    """The connection dropped or the backend sent something that is not HTTP/1.1."""


class Connection(asyncio.Protocol):
    """One keep-alive connection and the answer being read on it."""

    __slots__ = (
        "_answer_waiter",
        "_body_waiter",
        "_buffered",
        "_chunks",
        "_error",
        "_head_size",
        "_loop",
        "_parser",
        "_paused",
        "_pool",
        "_sink",
        "complete",
        "got_bytes",
        "head",
        "idle_since",
        "keep_alive",
        "lost",
        "status",
        "transport",
        "uses",
    )

    def __init__(self, pool: ConnectionOwner, loop: asyncio.AbstractEventLoop) -> None:
        self._pool = pool
        self._loop = loop
        self._parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.uses = 0
        self.idle_since = 0.0
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.head: list[bytes] = []
        """What was read until the answer's head was complete (its body's first bytes too, mostly): a new
        list per answer, so an answer's `Response` reads its headers after the connection's next exchange."""
        self._head_size = 0
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._answer_waiter: asyncio.Future[None] | None = None
        self._body_waiter: asyncio.Future[None] | None = None
        self._sink: BodySink | None = None
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # typeshed types the argument BaseTransport for every protocol; a TCP connection's is a Transport
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        if not self.status:
            self.head.append(data)
            self._head_size += len(data)
        error: UpstreamError | None = None
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            error = ConnectionBroken("the backend switched protocols")
        except httptools.HttpParserError as exc:
            error = ConnectionBroken(f"the backend's answer is not valid HTTP/1.1 ({exc})")
        if not self.status and error is None and self._head_size > MAX_HEAD_BYTES:
            error = ConnectionBroken(f"the answer's head is not complete after {MAX_HEAD_BYTES} bytes")
        if self._sink is not None and (self._chunks or self.complete):
            self._deliver()  # after the parser returns: the sink's work is never inside its callbacks
        if error is not None:
            self._fail(error)

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pool.forget(self)
        if self.complete:
            return
        if self.status and not _delimited(head_of(self.head).lower()):
            self.on_message_complete()  # an answer delimited by the end of the connection
            if self._sink is not None:
                self._deliver()
            return
        why = f"{exc.__class__.__name__}: {exc}" if exc else "the backend closed the connection"
        self._fail(ConnectionBroken(why))

    def pause_writing(self) -> None:
        return None

    def resume_writing(self) -> None:
        return None

    # --- httptools callbacks (no `on_header`, a Python call per header: `header_in` reads those asked for) --

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        waiter = self._answer_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        if self._sink is not None:
            return  # handed to the sink once the parser returns (`data_received`); no reader waits
        self._buffered += len(body)
        if self._buffered > _READ_HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = not self.lost and self._parser.should_keep_alive()
        self._wake_reader()

    # --- the exchange ------------------------------------------------------------------------------------

    def _fail(self, error: UpstreamError) -> None:
        if self._error is None:
            self._error = error
        sink = self._sink
        if sink is not None:
            self._sink = None
            sink.failed(self._error)
        for waiter in (self._answer_waiter, self._body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self.abort()

    def _wake_reader(self) -> None:
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def send(self, request: bytes) -> asyncio.Future[None]:
        """Write `request`; the future is done when the answer's status line and headers arrived or the
        connection failed (then `answered` raises). Whoever awaits it aborts the connection if the wait is
        cancelled (gateway/upstream/client.py): a plain function, not a coroutine of its own."""
        self.uses += 1
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            raise ConnectionBroken("the connection closed before the request was sent")
        self._answer_waiter = waiter = self._loop.create_future()
        transport.write(request)
        return waiter

    def answered(self) -> None:
        """After `send`'s future: raises the failure that came instead of an answer's head."""
        self._answer_waiter = None
        if self._error is not None and not self.status:
            raise self._error

    async def read_some(self) -> bytes:
        """The answer bytes that arrived since the last call, waiting for some; b"" at the end."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                if self._paused and self.transport is not None:
                    self._paused = False
                    self.transport.resume_reading()
                return data
            if self.complete:
                return b""
            if self._error is not None:
                raise self._error
            self._body_waiter = waiter = self._loop.create_future()
            try:
                await waiter
            except BaseException:
                self.abort()
                raise
            finally:
                self._body_waiter = None

    def splice(self, sink: BodySink) -> None:
        """From now on hand the answer's body to `sink` as it is parsed, in `data_received`, instead of
        buffering it for `read_some`: no future and no task wake per read. What is buffered already is
        handed over at once; so is the end or the failure if it came. Until `unsplice` (the sink is
        dropped by itself once it was told the answer ended or failed)."""
        self._sink = sink
        self.hold(False)  # a high-water pause: what it kept is handed over now
        if self._chunks or self.complete:
            self._deliver()
        elif self._error is not None:
            self._sink = None
            sink.failed(self._error)

    def unsplice(self) -> None:
        """Back to buffering for `read_some`, reading the socket again if the sink had paused it."""
        self._sink = None
        self.hold(False)

    def hold(self, paused: bool) -> None:
        """Stop (True) or resume (False) reading the socket: the spliced relay's back-pressure."""
        transport = self.transport
        if paused == self._paused or transport is None or self.lost or transport.is_closing():
            return
        self._paused = paused
        if paused:
            transport.pause_reading()
        else:
            transport.resume_reading()

    def _deliver(self) -> None:
        sink = self._sink
        assert sink is not None  # only called while spliced
        chunks = self._chunks
        data = b"" if not chunks else chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        complete = self.complete
        if complete:
            self._sink = None
        sink.received(data, complete)

    def has_buffered(self) -> bool:
        return bool(self._chunks)

    def take_buffered(self) -> bytes:
        """The answer bytes that arrived and were not read yet, without waiting."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    async def read_all(self) -> bytes:
        if self.complete and not self._paused and self._sink is None:  # all here (a small answer, mostly)
            return self.take_buffered()
        parts: list[bytes] = []
        while True:
            data = await self.read_some()
            if not data:
                return data.join(parts) if len(parts) != 1 else parts[0]
            parts.append(data)

    def half_close(self) -> bool:
        """Send our end of the connection (FIN) and keep reading: vLLM (uvicorn) and aiohttp servers take
        it as a disconnect and close their side once what they had written is flushed. False when the
        transport cannot (TLS) or the connection is gone."""
        transport = self.transport
        if transport is None or self.lost or not transport.can_write_eof():
            return False
        self.keep_alive = False
        transport.write_eof()
        return True

    def abort(self) -> None:
        """Drop the connection now; never pooled again (connection_lost follows and frees its slot)."""
        transport = self.transport
        if transport is not None and not self.lost:
            self.lost = True
            transport.abort()

    def finished(self) -> bool:
        """The caller is done with the answer: pool the connection if it can carry another (True), else
        drop it (False)."""
        if self.complete and self.keep_alive and not self.lost and self._error is None:
            self._parser = httptools.HttpResponseParser(self)
            self._reset()
            self._pool.put_back(self)
            return True
        self.abort()
        return False


def _delimited(lowered_head: bytes) -> bool:
    """The body's length is in the head (Content-Length or chunked), not the connection's end."""
    return b"\r\ncontent-length:" in lowered_head or b"\r\ntransfer-encoding:" in lowered_head
