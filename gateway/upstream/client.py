"""HTTP/1.1 to the backends on the request path: pooled keep-alive connections, one asyncio protocol
each, answers parsed by httptools (llhttp, the parser uvicorn uses).

Why not aiohttp here: a forwarded request needs one write and one parse, and aiohttp's general client
(request and response objects, payload registry, header multidicts, stream readers, timers) cost about
a third of the gateway's CPU per request on one core; this client does the same hop for a fraction of
that (`python -m loadtest.bench.http_clients` compares them; docs/internals.md, design notes, has figures).
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
from collections.abc import Awaitable
from urllib.parse import urlsplit

from gateway.upstream.connection import (
    BodySink,
    ConnectFailed,
    Connection,
    ConnectionBroken,
    ConnectTimeout,
    UpstreamError,
    head_of,
    header_in,
)

KEEPALIVE_SECONDS = 4.0
"""How long an idle pooled connection is kept: shorter than uvicorn's default of 5 s (vLLM's server), so
we never reuse a connection it is closing."""

__all__ = [
    "KEEPALIVE_SECONDS",
    "BackendClient",
    "ConnectFailed",
    "ConnectTimeout",
    "ConnectionBroken",
    "Pool",
    "Response",
    "UpstreamError",
]


class Response:
    """A backend's answer: status and headers arrived, the body is read on demand."""

    __slots__ = ("_conn", "_done", "_head", "_lowered", "_pieces", "closed", "readany", "status")

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self.readany = conn.read_some
        """The body bytes that arrived since the last call (`Transport`'s `readany`), bound straight to the
        connection's: one coroutine less per chunk relayed."""
        self._done = False
        self.closed = False
        """The connection was dropped rather than pooled (set once the answer is released or closed)."""
        self.status = conn.status
        self._pieces = conn.head
        self._head = self._lowered = b""

    def header(self, name: str) -> str | None:
        head = self._head
        if not head:
            self._head = head = head_of(self._pieces)
            self._lowered = head.lower()
        return header_in(head, self._lowered, name)

    @property
    def content_type(self) -> str:
        """The media type without parameters (`text/event-stream`), as aiohttp's `content_type`."""
        value = self.header("content-type")
        if value is None:
            return "application/octet-stream"
        return value.partition(";")[0].strip().lower()

    def read(self) -> Awaitable[bytes]:
        return self._conn.read_all()

    def all_read(self) -> bool:
        conn = self._conn
        return conn.complete and not conn.has_buffered()

    def take_buffered(self) -> bytes:
        return self._conn.take_buffered()

    def half_close(self) -> bool:
        return self._conn.half_close()

    def splice(self, sink: BodySink) -> None:
        """Hand the rest of the body to `sink` as it arrives (`Connection.splice`), until `unsplice`."""
        self._conn.splice(sink)

    def unsplice(self) -> None:
        self._conn.unsplice()

    def hold(self, paused: bool) -> None:
        """Stop or resume reading the backend's socket while spliced (back-pressure)."""
        self._conn.hold(paused)

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
        self._idle: list[Connection] = []
        self._waiters: deque[asyncio.Future[Connection | None]] = deque()
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

    def idle(self) -> Connection | None:
        """A pooled connection still fresh, if any (`acquire` without a coroutine)."""
        idle = self._idle
        if idle:
            expired_before = self._loop.time() - self._keepalive
            while idle:
                conn = idle.pop()
                if conn.idle_since >= expired_before and not conn.lost:
                    return conn
                conn.abort()  # connection_lost will forget it
        return None

    async def acquire(self, connect_timeout: float) -> Connection:
        conn = self.idle()
        if conn is not None:
            return conn
        if self.limit and self._open >= self.limit:
            waiter: asyncio.Future[Connection | None] = self._loop.create_future()
            self._waiters.append(waiter)
            try:
                handed = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    handed_back = waiter.result()
                    if handed_back is not None:
                        self.put_back(handed_back)
                    else:
                        self._slot_freed()
                raise
            if handed is not None:
                return handed
        return await self._connect(connect_timeout)

    async def _connect(self, within: float) -> Connection:
        self._open += 1
        loop = self._loop
        try:
            async with asyncio.timeout(within):
                _, conn = await loop.create_connection(
                    lambda: Connection(self, loop),
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

    def put_back(self, conn: Connection) -> None:
        """A connection ready for another exchange: to the first waiter, else to the idle list."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        conn.idle_since = self._loop.time()
        self._idle.append(conn)

    def forget(self, conn: Connection) -> None:
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
    """The pools of all backends: the gateway's `Transport` (gateway/upstream/transport.py). `send` posts
    one request and returns once the answer's headers are in."""

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

    async def send(
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
            conn = pool.idle() or await pool.acquire(connect_timeout)
            reused = conn.uses > 0
            try:
                answered = conn.send(request)
                try:
                    await answered
                except BaseException:
                    conn.abort()
                    raise
                conn.answered()
            except ConnectionBroken:
                if reused and not conn.got_bytes:
                    continue  # closed by the backend while idle: it never saw this request
                raise
            return Response(conn)
        raise ConnectionBroken("the backend closed two connections before answering")

    post = send

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
