"""A lean Redis client for the hot path's one kind of call: `EVALSHA` of a Lua script, pipelined on one
connection.

redis-py costs tens of microseconds of Python per call (packing every argument, the pool, the retry
wrapper, the reply parser); under load that was most of what keys and limits cost. Here the caller hands
over arguments already encoded (what is the same for every request of a key is encoded once), and the
parser knows just what scripts answer: bulk strings, integers, arrays and errors.

NOSCRIPT (Redis restarted or flushed its scripts) resends the call as `EVAL`, which loads the script. A
lost connection is redialled once for the calls it had in flight (as the redis-py client this replaces
retried once); a call not answered within `timeout_s` fails with TimeoutError and the connection is
dropped (answers after it could no longer be matched to their calls).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Callable
from typing import Any

Reply = Any
"""bytes, int, None, a list of replies, or a `ScriptReplyError`."""
OnReply = Callable[[Reply | BaseException], None]

_INCOMPLETE = object()


class ScriptReplyError(Exception):
    """An error Redis answered (`-ERR ...`)."""


def bulk(value: bytes | str | int) -> bytes:
    """One argument in RESP (`$<len>\\r\\n<data>\\r\\n`)."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def bulk_int(value: int) -> bytes:
    data = b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def _command(*args: bytes | str | int) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)


class _Call:
    __slots__ = ("argc", "body", "evaled", "numkeys", "on_reply", "redialled", "timer")

    def __init__(self, argc: int, body: bytes, numkeys: int, on_reply: OnReply) -> None:
        self.argc, self.body, self.numkeys, self.on_reply = argc, body, numkeys, on_reply
        self.timer: asyncio.TimerHandle | None = None
        self.evaled = False
        self.redialled = False


def _parse(buf: bytearray, pos: int) -> tuple[Reply, int] | object:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return _INCOMPLETE
    kind, line = buf[pos], buf[pos + 1 : end]
    if kind == 36:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            return _INCOMPLETE
        return bytes(buf[end + 2 : stop]), stop + 2
    if kind == 42:  # * array
        size, pos = int(line), end + 2
        items: list[Reply] = []
        for _ in range(max(size, 0)):
            parsed = _parse(buf, pos)
            if parsed is _INCOMPLETE:
                return _INCOMPLETE
            item, pos = parsed  # type: ignore[misc]
            items.append(item)
        return (items if size >= 0 else None), pos
    if kind == 58:  # : integer
        return int(line), end + 2
    if kind == 45:  # - error
        return ScriptReplyError(line.decode(errors="replace")), end + 2
    return bytes(line), end + 2  # + simple string (and RESP3 types a script never answers)


class ScriptClient(asyncio.Protocol):
    def __init__(
        self,
        script: str,
        *,
        host: str = "127.0.0.1",
        port: int = 6379,
        path: str | None = None,
        ssl: bool = False,
        username: str | None = None,
        password: str | None = None,
        db: int = 0,
        timeout_s: float = 1.0,
    ) -> None:
        self._script = script.encode()
        self._sha = hashlib.sha1(self._script).hexdigest().encode()
        self._address = (host, port, path, ssl)
        self._hello: list[bytes] = []
        if password:
            self._hello.append(_command("AUTH", *([username] if username else []), password))
        if db:
            self._hello.append(_command("SELECT", db))
        self._timeout = timeout_s
        self._transport: asyncio.Transport | None = None
        self._dialling: asyncio.Task[None] | None = None
        self._queued: list[_Call] = []
        self._sent: deque[_Call] = deque()
        self._buffer = bytearray()
        self._closed = False

    @classmethod
    def like(cls, client: Any, script: str, timeout_s: float) -> ScriptClient:
        """A client to the Redis that `client` (redis-py's asyncio client) talks to."""
        pool = client.connection_pool
        kw = pool.connection_kwargs
        return cls(
            script,
            host=kw.get("host", "127.0.0.1"),
            port=int(kw.get("port", 6379)),
            path=kw.get("path"),
            ssl="SSL" in pool.connection_class.__name__,
            username=kw.get("username"),
            password=kw.get("password"),
            db=int(kw.get("db") or 0),
            timeout_s=timeout_s,
        )

    # --- calls -----------------------------------------------------------------------------------------

    def call(self, argc: int, body: bytes, on_reply: OnReply, numkeys: int = 0) -> None:
        """Run the script with `argc` arguments (keys then args), `body` their RESP encoding; `on_reply`
        gets the answer or the exception, once, from the event loop."""
        call = _Call(argc, body, numkeys, on_reply)
        if self._transport is not None:
            self._write(call)
        else:
            self._queue(call)

    def _queue(self, call: _Call) -> None:
        self._queued.append(call)
        if self._dialling is None:
            self._dialling = asyncio.get_running_loop().create_task(self._dial())

    def _write(self, call: _Call) -> None:
        if call.evaled:
            head = b"*%d\r\n$4\r\nEVAL\r\n" % (call.argc + 3) + bulk(self._script)
        else:
            head = b"*%d\r\n$7\r\nEVALSHA\r\n$40\r\n%s\r\n" % (call.argc + 3, self._sha)
        self._transport.write(head + bulk_int(call.numkeys) + call.body)  # type: ignore[union-attr]
        call.timer = asyncio.get_running_loop().call_later(self._timeout, self._timed_out, call)
        self._sent.append(call)

    def _timed_out(self, call: _Call) -> None:
        call.timer = None
        if call in self._sent:
            self._sent.remove(call)
            call.on_reply(TimeoutError(f"Redis did not answer within {self._timeout}s"))
            if self._transport is not None:
                self._transport.abort()

    # --- the connection --------------------------------------------------------------------------------

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        host, port, path, ssl = self._address
        try:
            async with asyncio.timeout(self._timeout):
                if path:
                    await loop.create_unix_connection(lambda: self, path)
                else:
                    await loop.create_connection(lambda: self, host, port, ssl=ssl or None)
                for command in self._hello:
                    answered: asyncio.Future[Reply] = loop.create_future()
                    self._handshake(command, answered)
                    reply = await answered
                    if isinstance(reply, BaseException):
                        raise reply
        except BaseException as exc:
            if self._transport is not None:
                self._transport.abort()
            self._transport = None
            queued, self._queued = self._queued, []
            failure = exc if isinstance(exc, Exception) else ConnectionError("closed")
            for call in queued:
                call.on_reply(failure)
            if not isinstance(exc, Exception):
                raise
        else:
            queued, self._queued = self._queued, []
            for call in queued:
                self._write(call)
        finally:
            self._dialling = None

    def _handshake(self, command: bytes, answered: asyncio.Future[Reply]) -> None:
        def done(reply: Reply | BaseException) -> None:
            if not answered.done():
                answered.set_result(reply)

        call = _Call(0, b"", 0, done)
        self._transport.write(command)  # type: ignore[union-attr]
        self._sent.append(call)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._buffer.clear()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._buffer.clear()
        lost, self._sent = self._sent, deque()
        for call in lost:
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            if call.redialled or self._closed or not call.argc:
                call.on_reply(ConnectionError(f"connection to Redis lost: {exc or 'closed by Redis'}"))
            else:
                call.redialled = True
                self._queue(call)

    def data_received(self, data: bytes) -> None:
        buf = self._buffer
        buf += data
        pos, sent = 0, self._sent
        while sent:
            parsed = _parse(buf, pos)
            if parsed is _INCOMPLETE:
                break
            reply, pos = parsed  # type: ignore[misc]
            call = sent.popleft()
            if call.timer is not None:
                call.timer.cancel()
                call.timer = None
            if (
                isinstance(reply, ScriptReplyError)
                and not call.evaled
                and call.argc
                and str(reply).startswith("NOSCRIPT")
            ):
                call.evaled = True
                self._write(call)
                continue
            call.on_reply(reply)
        if pos:
            del buf[:pos]

    async def close(self) -> None:
        self._closed = True
        if self._dialling is not None:
            self._dialling.cancel()
        if self._transport is not None:
            self._transport.close()
