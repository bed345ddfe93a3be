"""Step 4b's steady state run in the backend connection's callbacks: `RelayedStream.pump` spliced.

When the client's server tells when its side fills and empties (`CycleSink` under the gateway's own server
protocol) and the backend's answer can hand its body over as it is parsed (the gateway's `Connection`),
each read is fed to the relay and written to the client inside `data_received`, with no future resolved
and no task stepped per read (docs/internals.md, what a streamed chunk costs).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gateway.request.sse import SseRelay
from gateway.upstream.connection import BodySink, UpstreamError

if TYPE_CHECKING:
    from gateway.openai.errors import GatewayError


class Watched(Protocol):
    """The gap watchdog (gateway/request/relay.py `GapWatchdog`): a read is awaited since `waiting_since`
    (None: the client's side is full, which is no stall)."""

    waiting_since: float | None


class SpliceSink(Protocol):
    """A `ChunkSink` (gateway/request/relay.py) whose server tells when the client's side fills and empties
    (`CycleSink` under the gateway's own server protocol): the relay can then run in the backend
    connection's callbacks."""

    def write(self, data: bytes) -> bool:
        """Send `data` (not empty) on; True when the client's side is full."""
        ...

    def end(self, data: bytes) -> None:
        """Send the last piece (possibly empty) and end the response."""
        ...

    @property
    def paused(self) -> bool: ...

    def watch_writable(self, on_writable: Callable[[bool], None]) -> bool:
        """Call `on_writable(False)` when the client's side fills, `(True)` when it empties; False when
        the server cannot."""
        ...

    def unwatch_writable(self) -> None: ...


class SplicedResponse(Protocol):
    """A `BackendResponse` that can hand its body over as it is parsed (gateway/upstream/client.py)."""

    def splice(self, sink: BodySink) -> None: ...

    def unsplice(self) -> None: ...

    def hold(self, paused: bool) -> None: ...


class Splice:
    """`RelayedStream.pump` run inside the backend connection's `data_received`: each read is fed to the
    relay and written to the client at once, with no future and no task wake per read; the pumping task
    waits on `done` only, resolved when the stream ends or fails. A client whose side is full pauses the
    backend socket until it empties (the gap watchdog does not count that time); a client gone cancels the
    pumping task, which unsplices before `RelayedStream.end` drains the rest."""

    __slots__ = ("_failed", "_last", "_loop", "_response", "_sink", "_sse", "_watchdog", "done")

    def __init__(
        self,
        sse: SseRelay,
        watchdog: Watched,
        loop: asyncio.AbstractEventLoop,
        last: Callable[[bytes], bytes],
        failed: Callable[[UpstreamError], GatewayError],
        sink: SpliceSink,
        response: SplicedResponse,
    ) -> None:
        """`last(out)`: the final piece, the stream marked complete; `failed(error)`: the error the stream
        ends with (the breaker told) — `RelayedStream`'s own."""
        self._sse = sse
        self._watchdog = watchdog
        self._loop = loop
        self._last = last
        self._failed = failed
        self._sink = sink
        self._response = response
        self.done: asyncio.Future[None] = loop.create_future()

    def start(self) -> bool:
        """Splice (False: the server cannot tell when its client's side empties; then pump as usual)."""
        if not self._sink.watch_writable(self._writable):
            return False
        self._watchdog.waiting_since = self._loop.time()
        self._response.splice(self)
        return True

    def stop(self) -> None:
        self._sink.unwatch_writable()
        self._response.unsplice()

    def _writable(self, writable: bool) -> None:
        if self.done.done():
            return
        try:
            self._response.hold(not writable)
        except Exception as exc:  # raised in the pumping task rather than in the server's callback
            self._crashed(exc)
            return
        self._watchdog.waiting_since = self._loop.time() if writable else None

    def _crashed(self, exc: Exception) -> None:
        self.stop()
        self.done.set_exception(exc)

    def received(self, data: bytes, complete: bool) -> None:
        if self.done.done():
            return
        try:
            out = self._sse.feed(data) if data else b""
            if complete:
                self._watchdog.waiting_since = None
                self._sink.unwatch_writable()
                self._sink.end(self._last(out))
                self.done.set_result(None)
                return
            full = self._sink.write(out) if out else self._sink.paused
            if full:
                self._response.hold(True)
            self._watchdog.waiting_since = None if full else self._loop.time()
        except Exception as exc:  # raised in the pumping task, as pump would raise it
            self._crashed(exc)

    def failed(self, error: UpstreamError) -> None:
        if self.done.done():
            return
        try:
            self._watchdog.waiting_since = None
            self._sink.unwatch_writable()
            self._sink.end(self._sse.error_event(self._failed(error)))
            self.done.set_result(None)
        except Exception as exc:
            self._crashed(exc)
