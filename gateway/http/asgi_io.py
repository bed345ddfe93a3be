"""Reading requests and writing replies in raw ASGI, for the `/v1` endpoints on the hot path.

The forwarding endpoints are Litestar ASGI route handlers rather than regular ones: a regular handler's
parameter resolution, response objects and middleware cost about as much CPU as the forwarding itself, and
the gateway adds every microsecond of it to every request (see docs/internals.md, design notes).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any, Protocol

from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.response_write import cycle_sink, head_and_body_written, send_head_and_body
from gateway.openai.errors import GatewayError, anthropic_error_json, body_too_large
from gateway.request.relay import RelayedStream
from gateway.request.reply_headers import Fixed

_CONTENT_TYPE = b"content-type"
_CONTENT_LENGTH = b"content-length"
_JSON = b"application/json"


class ClientGone(Exception):
    """The client disconnected before the request was read."""


def _check_length(scope: Any, limit: int) -> None:
    # Found in C rather than by a loop over the fifteen or so headers an SDK sends. (A second
    # Content-Length is refused by the HTTP parser; the bytes read are held to `limit` in any case.)
    value = dict(scope["headers"]).get(_CONTENT_LENGTH)
    if value is not None and value.isdigit() and int(value) > limit:
        raise body_too_large(limit)


def body_at_hand(scope: Any, receive: Any, limit: int) -> bytes | None:
    """`read_body` without a coroutine when `receive` is uvicorn's and its cycle holds the whole body
    already (a small request's, mostly): what `receive` would return at once, taken as it takes it; None
    when it would not (then `read_body`)."""
    cycle = getattr(receive, "__self__", None)
    if (
        type(cycle) is not RequestResponseCycle
        or cycle.more_body
        or cycle.waiting_for_100_continue
        or cycle.disconnected
        or cycle.response_complete
        or not cycle.message_event.is_set()
    ):
        return None
    _check_length(scope, limit)
    body = bytes(cycle.body)
    cycle.flow.resume_reading()
    cycle.message_event.clear()
    cycle.body = bytearray()
    if len(body) > limit:
        raise body_too_large(limit)
    return body


async def read_body(scope: Any, receive: Any, limit: int) -> bytes:
    """The request body, refused with 413 past `limit` (by Content-Length first, then by bytes read)."""
    _check_length(scope, limit)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientGone
    body: bytes = message.get("body", b"")
    if not message.get("more_body", False):
        if len(body) > limit:
            raise body_too_large(limit)
        return body
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _header_list(headers: dict[str, str], content_type: bytes) -> list[tuple[bytes, bytes]]:
    out = [(_CONTENT_TYPE, content_type)]
    if headers:
        out.extend((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items())
    return out


def _body_headers(
    headers: dict[str, str], body: bytes, content_type: bytes, raw_headers: list[tuple[bytes, bytes]] | None
) -> list[tuple[bytes, bytes]]:
    header_list = _header_list(headers, content_type)
    if raw_headers:
        header_list += raw_headers
    header_list.append((_CONTENT_LENGTH, b"%d" % len(body)))
    return header_list


async def send_body(
    send: Any,
    status: int,
    headers: dict[str, str],
    body: bytes,
    content_type: bytes,
    raw_headers: list[tuple[bytes, bytes]] | None = None,
    fixed: Fixed = (),
    lines: bytes = b"",
) -> None:
    header_list = _body_headers(headers, body, content_type, raw_headers)
    await send_head_and_body(send, status, header_list, body, False, fixed, lines)


def body_sent(
    send: Any,
    status: int,
    headers: dict[str, str],
    body: bytes,
    content_type: bytes,
    raw_headers: list[tuple[bytes, bytes]] | None = None,
    fixed: Fixed = (),
    lines: bytes = b"",
) -> bool:
    """`send_body` when it need not wait, without a coroutine (`head_and_body_written`): True once sent;
    False, nothing sent: `send_body` it is."""
    header_list = _body_headers(headers, body, content_type, raw_headers)
    return head_and_body_written(send, status, header_list, body, fixed, lines)


async def send_error(send: Any, error: GatewayError, request_id: str) -> None:
    headers = {"x-request-id": request_id, **error.headers}
    await send_body(send, error.status, headers, error.to_json(), _JSON)


async def send_anthropic_error(send: Any, error: GatewayError, request_id: str) -> None:
    """An error of the `/v1/messages` route, in Anthropic's shape."""
    headers = {"x-request-id": request_id, **error.headers}
    await send_body(send, error.status, headers, anthropic_error_json(error), _JSON)


DISCONNECT_HOOK = "switchyard_on_disconnect"
"""The attribute of uvicorn's request cycle (`receive.__self__`) that the gateway's server protocol sets to
None when the request starts and calls, if set, when the connection is lost (gateway/http/client_cap.py)."""


class DisconnectWatch:
    """Cancels the request's task when the client goes away, so the backend request is cancelled too.

    Started once the body is read and kept until the reply is sent: ASGI servers swallow writes to a
    closed connection. Under the gateway's own server protocol the lost connection calls the watch
    directly (`DISCONNECT_HOOK`), which costs nothing per request. Under another server only `receive()`
    says the client left (uvicorn answers it at once with `http.disconnect` when the connection closes,
    and also once the response is complete, hence `stop` before the last write): then one small task per
    request, parked on one future while the request waits.
    """

    __slots__ = ("_cycle", "_receive", "_task", "_watcher", "gone")

    def __init__(self, receive: Any) -> None:
        self._task = asyncio.current_task()
        self._receive = receive
        self.gone = False
        cycle = getattr(receive, "__self__", None)
        if cycle is not None and hasattr(cycle, DISCONNECT_HOOK):
            self._cycle: Any = cycle
            self._watcher: asyncio.Task[Any] | None = None
            if cycle.disconnected:  # gone while the body was being read
                self._lost()
            else:
                setattr(cycle, DISCONNECT_HOOK, self._lost)
        else:
            self._cycle = None
            self._watcher = self._arm()

    def _lost(self) -> None:
        if self._task is not None:
            self.gone = True
            self._task.cancel()

    def _arm(self) -> asyncio.Task[Any]:
        watcher = asyncio.get_running_loop().create_task(self._receive())
        watcher.add_done_callback(self._received)
        return watcher

    def _received(self, watcher: asyncio.Task[Any]) -> None:
        if watcher.cancelled() or watcher.exception() is not None:
            return
        if watcher.result()["type"] != "http.disconnect":
            self._watcher = self._arm()
            return
        self._lost()

    def stop(self) -> None:
        self._task = None  # a disconnect already received but not yet handled cancels nothing now
        if self._watcher is not None:
            self._watcher.cancel()
        elif self._cycle is not None:
            setattr(self._cycle, DISCONNECT_HOOK, None)
            self._cycle = None

    def swallow(self) -> bool:
        """In an `except CancelledError`: True (and the task uncancelled) when the cancel was ours."""
        if not self.gone:
            return False
        current = asyncio.current_task()
        if current is not None:
            current.uncancel()
        return True


class SentStream(Protocol):
    """A stream the HTTP layer sends (gateway/request/relay.py's `EventStream`, seen from this side)."""

    def __aiter__(self) -> AsyncIterator[bytes]: ...

    @property
    def last(self) -> bool: ...

    def end(self) -> None: ...


async def send_stream(
    send: Any,
    watch: DisconnectWatch,
    headers: dict[str, str],
    content_type: str,
    stream: SentStream,
    raw_headers: list[tuple[bytes, bytes]] | None = None,
    fixed: Fixed = (),
    lines: bytes = b"",
) -> None:
    """Send server-sent events as they come (`last` is set while the stream yields its final piece).

    A `RelayedStream` under uvicorn's protocol is pumped straight to its transport once the head is out
    (`RelayedStream.pump`, `CycleSink`); anything else is iterated and sent as ASGI messages."""
    try:
        header_list = _header_list(headers, content_type.encode("latin-1"))
        if raw_headers:
            header_list += raw_headers
        pieces: AsyncIterator[bytes] | None = None
        relayed = stream if isinstance(stream, RelayedStream) else None
        if relayed is not None:
            first = relayed.start()
            if not first and not relayed.last:  # no whole event yet: the head waits for one, with it
                pieces = relayed.rest()
                first = await anext(pieces, b"")
        else:
            pieces = aiter(stream)
            first = await anext(pieces, b"")  # sent with the head, in one write
        ended = stream.last
        if ended:  # the whole answer was in the backend's first chunk
            watch.stop()
        await send_head_and_body(send, 200, header_list, first, not ended, fixed, lines)
        if pieces is None:
            if ended or relayed is None:
                return
            sink = cycle_sink(send, watch.stop)
            if sink is not None:  # the rest straight to uvicorn's transport, piece by piece
                await relayed.pump(sink)
                return
            pieces = relayed.rest()
        async for chunk in pieces:
            if stream.last:  # the backend's answer is all here: end the response with it, in one write
                watch.stop()
                await send({"type": "http.response.body", "body": chunk})
                ended = True
            elif chunk:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if not ended:
            watch.stop()
            await send({"type": "http.response.body", "body": b""})
    except asyncio.CancelledError:
        if not watch.swallow():
            raise
    finally:
        watch.stop()
        with contextlib.suppress(Exception):
            stream.end()
