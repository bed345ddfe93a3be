"""Step 4b: relay an open stream to the client, chunk by chunk, as it arrives from the backend.

`between_chunks` (gateway/request/limits.py) bounds each gap after the first chunk; `total`, when set,
bounds the whole stream. Once the first chunk has been relayed there is no retry: a failure ends the
stream with an error event, and the usage produced so far is still accounted. A stream whose client
left is drained: half-closed (vLLM takes it as a disconnect) and read to its end in the background, so
every token the backend sent is counted.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from time import monotonic
from typing import Protocol, cast

from backends.models import Backend
from gateway.openai.errors import GatewayError, upstream_failed, upstream_timeout
from gateway.request.context import RequestContext
from gateway.request.splice import Splice, SplicedResponse, SpliceSink
from gateway.request.sse import SseRelay
from gateway.upstream.connection import UpstreamError
from gateway.upstream.transport import BackendResponse

ABANDONED_DRAIN_S = 2.0
"""How long the connection of a stream whose client left stays half-closed, so the tokens the backend
had already sent (in flight, in socket buffers) are counted before it takes the disconnect."""


@dataclass(slots=True)
class OpenStream:
    """A streaming answer whose status is 200 and whose first chunk has arrived."""

    backend: Backend
    response: BackendResponse
    first_chunk: bytes


class GapWatchdog:
    """Closes the upstream response when one read waits longer than the gap allowed.

    One timer per gap period instead of one per chunk; time spent waiting for a slow client does not
    count, since only the span of an upstream read is watched (`waiting_since`: set when a read starts,
    None while the client's side is full).
    """

    __slots__ = (
        "_deadline",
        "_handle",
        "_limit",
        "_loop",
        "_response",
        "fired",
        "past_total",
        "waiting_since",
    )

    def __init__(
        self,
        response: BackendResponse,
        limit: float,
        loop: asyncio.AbstractEventLoop,
        deadline: float | None = None,
    ) -> None:
        self._loop = loop
        self._response = response
        self._limit = limit
        self._deadline = deadline
        """Loop time at which the request's `total` timeout ends the stream, if it has one."""
        self.waiting_since: float | None = None
        self.fired = False
        self.past_total = False
        self._handle = self._loop.call_at(self._next(self._loop.time()), self._check)

    def _next(self, at: float) -> float:
        at += self._limit
        return at if self._deadline is None or at < self._deadline else self._deadline

    def _check(self) -> None:
        now = self._loop.time()
        since = self.waiting_since
        if self._deadline is not None and now >= self._deadline:
            self.fired = self.past_total = True
            self._response.close()
            return
        if since is not None and now - since >= self._limit:
            self.fired = True
            self._response.close()
            return
        self._handle = self._loop.call_at(self._next(since if since is not None else now), self._check)

    def cancel(self) -> None:
        self._handle.cancel()


class ChunkSink(Protocol):
    """Where `RelayedStream.pump` writes: a response already started, written to without a message, a
    coroutine or an await per piece while the client keeps up (gateway/http/response_write.py)."""

    def write(self, data: bytes) -> bool:
        """Send `data` (not empty) on; True when the client's side is full: `drain` before writing more."""
        ...

    async def drain(self) -> None:
        """Wait until the client's side takes writes again (at once when it does)."""
        ...

    def end(self, data: bytes) -> None:
        """Send the last piece (possibly empty) and end the response."""
        ...


class EventStream(Protocol):
    """What the HTTP layer sends as a stream: `RelayedStream`, or a wrapper of one (the Responses API's)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    @property
    def last(self) -> bool:
        """The piece being yielded ends the backend's answer: the response can end with it."""
        ...

    def end(self) -> None: ...


class RelayedStream:
    """Async-iterates the bytes to send the client, as they arrive from the backend.

    A failing backend ends the iteration with an OpenAI-style error event. `end()` runs once, when
    iteration stops for any reason (the HTTP layer calls it again in its own `finally`, so a client gone
    before the first chunk is accounted too): a completed answer's connection goes back to the pool; a
    stream whose client left is half-closed and drained in a background task; then `ctx.ended_at` is set
    (when the client's side ended) and `finish(ctx)` is called (once everything sent is counted).
    """

    __slots__ = (
        "_between_chunks",
        "_completed",
        "_ctx",
        "_draining",
        "_ended",
        "_finish",
        "_first_fed",
        "_loop",
        "_sse",
        "_stream",
        "_watchdog",
        "last",
    )

    def __init__(
        self,
        ctx: RequestContext,
        stream: OpenStream,
        sse: SseRelay,
        finish: Callable[[RequestContext], object],
        between_chunks: float,
        deadline: float | None = None,
        draining: set[asyncio.Task[None]] | None = None,
    ) -> None:
        self._ctx = ctx
        self._stream = stream
        self._sse = sse
        self._draining = draining if draining is not None else set()
        self._finish = finish
        self._between_chunks = between_chunks
        self._loop = asyncio.get_running_loop()
        self._watchdog = GapWatchdog(stream.response, between_chunks, self._loop, deadline)
        self._completed = False
        self._first_fed = False
        self._ended = False
        self.last = False
        """The piece being yielded ends the stream (the backend's answer was read to its end), so the HTTP
        layer can end the response with it rather than with one more write."""

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._events()

    def start(self) -> bytes:
        """The first piece to send (from the chunk that opened the stream); `last` says it ends the answer.
        `pump` relays the rest."""
        out = self._sse.feed(self._stream.first_chunk)
        self._first_fed = True
        if self._stream.response.all_read():
            return self._last(out)
        return out

    def rest(self) -> AsyncIterator[bytes]:
        """After `start` (its piece not the last): the pieces iterating the stream yields after it."""
        return self._events(started=True)

    async def _events(self, started: bool = False) -> AsyncIterator[bytes]:
        stream, sse, watchdog, loop = self._stream, self._sse, self._watchdog, self._loop
        try:
            response = stream.response
            if not started:
                out = self.start()
                if self.last:
                    yield out
                    return
                if out:
                    yield out
            read = response.readany
            while True:
                watchdog.waiting_since = loop.time()
                try:
                    data = await read()
                except UpstreamError as exc:
                    yield sse.error_event(self._failed(exc))
                    return
                watchdog.waiting_since = None
                if not data:
                    self._completed = True
                    tail = sse.flush()
                    if tail:
                        yield tail
                    return
                out = sse.feed(data)
                if response.all_read():
                    yield self._last(out)
                    return
                if out:
                    yield out
        finally:
            self.end()

    async def pump(self, sink: ChunkSink) -> None:
        """After `start` (its piece sent, not the last), relay the rest of the stream to `sink` and end the
        response with its last piece: what iterating the stream yields, without an async generator and a
        send message between the backend's read and the client's write. What arrived in one read is one
        write; the next read waits while the client's side is full (back-pressure), as iterating does.
        When the sink's server tells when its client's side empties and the response can hand its body
        over as it is parsed, the relay runs in the backend connection's callbacks instead (`Splice`)."""
        sse, watchdog, loop = self._sse, self._watchdog, self._loop
        response = self._stream.response
        read = response.readany
        write = sink.write
        try:
            await sink.drain()  # the head and first piece may have filled the client's side
            if hasattr(sink, "watch_writable") and hasattr(response, "splice"):
                spliced = cast(SpliceSink, sink), cast(SplicedResponse, response)
                splice = Splice(sse, watchdog, loop, self._last, self._failed, *spliced)
                if splice.start():
                    try:
                        await splice.done
                    finally:
                        splice.stop()
                    return
            while True:
                watchdog.waiting_since = loop.time()
                try:
                    data = await read()
                except UpstreamError as exc:
                    sink.end(sse.error_event(self._failed(exc)))
                    return
                watchdog.waiting_since = None
                if not data:
                    self._completed = True
                    sink.end(sse.flush())
                    return
                out = sse.feed(data)
                if response.all_read():
                    sink.end(self._last(out))
                    return
                if out and write(out):
                    await sink.drain()
        finally:
            self.end()

    def _failed(self, exc: UpstreamError) -> GatewayError:
        """The error a read failing after the stream started ends it with (the breaker told)."""
        backend, watchdog = self._stream.backend, self._watchdog
        if watchdog.past_total:
            error = upstream_timeout(backend.name, 0, "the whole answer within its total timeout")
        elif watchdog.fired:
            error = upstream_timeout(backend.name, self._between_chunks, "a chunk")
            backend.breaker.failure("a stream stalled")
        else:
            error = upstream_failed(backend.name, f"stream broke ({exc.__class__.__name__})")
            backend.breaker.failure("a stream broke")
        self._sse.failed = error
        return error

    def _last(self, out: bytes) -> bytes:
        """The final piece: what the relay holds back, with what the backend left unterminated."""
        self._completed = self.last = True
        tail = self._sse.flush()
        return out + tail if tail else out

    def end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._watchdog.cancel()
        response = self._stream.response
        self._ctx.ended_at = monotonic()
        if not self._first_fed:  # the client left before the stream was relayed: its first chunk counts
            self._first_fed = True
            self._sse.feed(self._stream.first_chunk)
        if self._completed:
            response.release()
        elif self._sse.failed is None and response.half_close():
            task = self._loop.create_task(self._count_the_rest())
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
            return
        else:
            self._sse.feed(response.take_buffered())  # sent by the backend, so generated: counted
            response.close()
        self._finish(self._ctx)

    async def _count_the_rest(self) -> None:
        response, sse = self._stream.response, self._sse
        try:
            async with asyncio.timeout(ABANDONED_DRAIN_S):
                while data := await response.readany():
                    sse.feed(data)
        except (UpstreamError, TimeoutError):
            pass
        finally:
            response.close()
            self._finish(self._ctx)

    async def aclose(self) -> None:
        self.end()
