"""HTTP/1.1 to the backends on the request path: pooled keep-alive connections, one asyncio protocol
each, answers parsed by httptools (llhttp, the parser uvicorn uses).

Why not aiohttp here: a forwarded request needs one write and one parse, and aiohttp's general client
(request and response objects, payload registry, header multidicts, stream readers, timers) cost about
a third of the gateway's CPU per request on one core; this client does the same hop for a fraction of
that (`python -m loadtest.bench_http_clients` compares them; the README's design notes have figures).
aiohttp still carries the calls off the request path: health checks, `/metrics` scrapes, `/tokenize`.

A connection serves one exchange at a time. It goes back to its pool only when its answer was read to
the end and the backend allows keep-alive; an exchange that is abandoned (timeout, stream cut short)
aborts the connection, which is how vLLM learns to stop generating; a stream whose client left is
half-closed instead, so what the backend had already sent can still be read and counted. A pooled
connection that the backend closed while idle is noticed on reuse (the write fails or the connection
drops before any byte of the answer); the request is then sent once more on a fresh connection, since
the backend never saw it.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from urllib.parse import urlsplit

import httptools

_READ_HIGH_WATER = 256 * 1024
"""Buffered answer bytes above which the socket stops being read until the relay catches up."""


class UpstreamError(Exception):
    """The exchange with a backend failed before a complete answer."""


class ConnectFailed(UpstreamError):
    """No connection: refused, unreachable, or the name does not resolve."""


class ConnectTimeout(UpstreamError):
    """No connection within the connect timeout."""


class ConnectionBroken(UpstreamError):
    """The connection dropped or the backend sent something that is not HTTP/1.1."""


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the answer being read on it."""

    __slots__ = (
        "_answer_waiter",
        "_body_waiter",
        "_buffered",
        "_chunks",
        "_error",
        "_header_name",
        "_headers",
        "_length_known",
        "_loop",
        "_parser",
        "_paused",
        "_pool",
        "complete",
        "got_bytes",
        "idle_since",
        "keep_alive",
        "lost",
        "status",
        "transport",
        "uses",
    )

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
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
        self._headers: dict[str, str] = {}
        self._header_name = ""
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._error: UpstreamError | None = None
        self._answer_waiter: asyncio.Future[None] | None = None
        self._body_waiter: asyncio.Future[None] | None = None
        self._length_known = False
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False

    # --- asyncio.Protocol -------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(ConnectionBroken("the backend switched protocols"))
        except httptools.HttpParserError as exc:
            self._fail(ConnectionBroken(f"the backend's answer is not valid HTTP/1.1 ({exc})"))

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._pool.forget(self)
        if self.complete:
            return
        if self.status and not self._length_known:
            self.on_message_complete()  # an answer delimited by the end of the connection
            return
        why = f"{exc.__class__.__name__}: {exc}" if exc else "the backend closed the connection"
        self._fail(ConnectionBroken(why))

    def pause_writing(self) -> None:
        return None

    def resume_writing(self) -> None:
        return None

    # --- httptools callbacks -----------------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        self._headers[key] = value.decode("latin-1")
        if key == "content-length" or key == "transfer-encoding":
            self._length_known = True

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        waiter = self._answer_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
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
        for waiter in (self._answer_waiter, self._body_waiter):
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        self.abort()

    def _wake_reader(self) -> None:
        waiter = self._body_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def send(self, request: bytes) -> None:
        """Write `request` and wait for the answer's status line and headers."""
        self.uses += 1
        transport = self.transport
        if transport is None or self.lost or transport.is_closing():
            raise ConnectionBroken("the connection closed before the request was sent")
        self._answer_waiter = waiter = self._loop.create_future()
        transport.write(request)
        try:
            await waiter
        except BaseException:
            self.abort()
            raise
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

    def take_buffered(self) -> bytes:
        """The answer bytes that arrived and were not read yet, without waiting."""
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        return data

    async def read_all(self) -> bytes:
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

    @property
    def headers(self) -> dict[str, str]:
        return self._headers


class Response:
    """A backend's answer: status and headers arrived, the body is read on demand."""

    __slots__ = ("_conn", "_done", "closed", "headers", "status")

    def __init__(self, conn: _Connection) -> None:
        self._conn = conn
        self._done = False
        self.closed = False
        """The connection was dropped rather than pooled (set once the answer is released or closed)."""
        self.status = conn.status
        self.headers = conn.headers
        """Lower-case names."""

    @property
    def content_type(self) -> str:
        """The media type without parameters (`text/event-stream`), as aiohttp's `content_type`."""
        value = self.headers.get("content-type")
        if value is None:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    async def read(self) -> bytes:
        return await self._conn.read_all()

    async def readany(self) -> bytes:
        return await self._conn.read_some()

    def take_buffered(self) -> bytes:
        return self._conn.take_buffered()

    def half_close(self) -> bool:
        return self._conn.half_close()

    def release(self) -> None:
        """Done with a fully read answer: the connection goes back to the pool (else it is closed)."""
        if not self._done:
            self._done = True
            self.closed = not self._conn.finished()

    def close(self) -> None:
        """Abandon the answer: the connection is aborted, so the backend stops working on it."""
        self._done = self.closed = True
        self._conn.abort()


class Pool:
    """Keep-alive connections to one backend origin, at most `limit` open at once (0: no limit)."""

    __slots__ = (
        "_host",
        "_idle",
        "_keepalive",
        "_loop",
        "_open",
        "_port",
        "_ssl",
        "_waiters",
        "head",
        "limit",
    )

    def __init__(self, url: str, limit: int, keepalive: float, loop: asyncio.AbstractEventLoop) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"backend URL {url!r} is not http(s)://host[:port][/prefix]")
        secure = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if secure else 80)
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if secure else None
        self._loop = loop
        self._keepalive = keepalive
        self._idle: list[_Connection] = []
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()
        self._open = 0
        self.limit = limit
        default_port = parts.port is None
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        authority = host if default_port else f"{host}:{self._port}"
        self.head = (parts.path.rstrip("/"), f"Host: {authority}\r\n".encode("latin-1"))
        """(path prefix, Host header line)."""

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def acquire(self, connect_timeout: float) -> _Connection:
        idle = self._idle
        if idle:
            expired_before = self._loop.time() - self._keepalive
            while idle:
                conn = idle.pop()
                if conn.idle_since >= expired_before and not conn.lost:
                    return conn
                conn.abort()  # connection_lost will forget it
        if self.limit and self._open >= self.limit:
            waiter: asyncio.Future[_Connection | None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.result() is not None:
                    self.put_back(waiter.result())  # type: ignore[arg-type]
                elif waiter.done() and not waiter.cancelled():
                    self._slot_freed()
                raise
            if handed is not None:
                return handed
        return await self._connect(connect_timeout)

    async def _connect(self, within: float) -> _Connection:
        self._open += 1
        loop = self._loop
        try:
            async with asyncio.timeout(within):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, loop),
                    self._host,
                    self._port,
                    ssl=self._ssl,
                    server_hostname=self._host if self._ssl is not None else None,
                )
        except TimeoutError:
            self._release_slot()
            raise ConnectTimeout(f"no connection within {within:g} s") from None
        except OSError as exc:
            self._release_slot()
            raise ConnectFailed(f"{exc.__class__.__name__}: {exc.strerror or exc}") from exc
        except BaseException:
            self._release_slot()
            raise
        return conn

    def put_back(self, conn: _Connection) -> None:
        """A connection ready for another exchange: to the first waiter, else to the idle list."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = self._loop.time()
        self._idle.append(conn)

    def forget(self, conn: _Connection) -> None:
        """The connection closed: its slot is free."""
        if conn in self._idle:
            self._idle.remove(conn)
        self._release_slot()

    def _release_slot(self) -> None:
        self._open -= 1
        self._slot_freed()

    def _slot_freed(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # a slot to open a connection in
                return

    def close(self) -> None:
        for conn in list(self._idle):
            conn.abort()
        self._idle.clear()


class BackendClient:
    """The pools of all backends; `post` sends one request and returns once the answer's headers are in."""

    __slots__ = ("_keepalive", "_limit", "_loop", "_pools")

    def __init__(self, limit_per_backend: int, keepalive: float) -> None:
        self._limit = limit_per_backend
        self._keepalive = keepalive
        self._pools: dict[str, Pool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def pool(self, base_url: str) -> Pool:
        pool = self._pools.get(base_url)
        if pool is None:
            loop = self._loop or asyncio.get_running_loop()
            self._loop = loop
            pool = self._pools[base_url] = Pool(base_url, self._limit, self._keepalive, loop)
        return pool

    async def post(
        self, base_url: str, path: str, headers: bytes, body: bytes, connect_timeout: float
    ) -> Response:
        """POST `body` to `base_url` + `path`; `headers` are ready-made `Name: value\\r\\n` lines."""
        pool = self.pool(base_url)
        prefix, host = pool.head
        request = b"".join(
            (
                b"POST ",
                (prefix + path).encode("latin-1"),
                b" HTTP/1.1\r\n",
                host,
                headers,
                b"Content-Length: ",
                str(len(body)).encode("latin-1"),
                b"\r\n\r\n",
                body,
            )
        )
        for _ in range(2):
            conn = await pool.acquire(connect_timeout)
            reused = conn.uses > 0
            try:
                await conn.send(request)
            except ConnectionBroken:
                if reused and not conn.got_bytes:
                    continue  # closed by the backend while idle: it never saw this request
                raise
            return Response(conn)
        raise ConnectionBroken("the backend closed two connections before answering")

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
