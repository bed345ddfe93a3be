"""A response's head and its first body piece in one socket write, under uvicorn's httptools protocol.

uvicorn's `send` writes the status line and headers as soon as `http.response.start` arrives, then each
body message on its own, and checks every header with two regular expressions: a whole JSON answer costs
two writes (two syscalls) and a stream one more than it has pieces. The gateway knows the body, or a
stream's first piece, when it starts the response, so `send_head_and_body` does what uvicorn's `send` does
for the two messages in one write: the same bytes on the wire and the same cycle state afterwards
(tests/unit/gateway/test_response_write.py compares both with uvicorn's own path), the headers checked as
uvicorn checks them: the names once per sequence of names (the gateway sends a handful), the values by one
search over all of them, and the headers that are the same tuple each time (`fixed`: a backend's, its
route's) once per tuple, joined once. Anything else (another server, a cycle in another
state, the access log on, a header uvicorn would act on or refuse) goes through `send` as two messages.
The rest of a chunked stream is written the same way, piece by piece (`CycleSink`).
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

from uvicorn.protocols.http.httptools_impl import (
    HEADER_RE,
    HEADER_VALUE_RE,
    STATUS_LINE,
    RequestResponseCycle,
)

from gateway.request.reply_headers import Fixed
from gateway.tenants.answers import pairs

WRITABLE_HOOK = "switchyard_on_writable"
"""The attribute of the gateway's server protocol (gateway/http/client_cap.py) that it calls, if set, with
False from `pause_writing` and True from `resume_writing`: a spliced relay's back-pressure."""

_CONTENT_LENGTH = b"content-length"
_TRANSFER_ENCODING = b"transfer-encoding"
_CONNECTION = b"connection"
"""Headers uvicorn acts on: their answers go through its `send`."""


async def send_head_and_body(
    send: Any,
    status: int,
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    more_body: bool,
    fixed: Fixed = (),
    lines: bytes = b"",
) -> None:
    """`http.response.start` with `headers`, then `fixed` (the same tuple for the same headers: checked
    once), then `lines` (`name: value\\r\\n` each, numbers the gateway formats: sent unchecked), then
    `http.response.body` with `body` (and `more_body`)."""
    cycle = getattr(send, "__self__", None)
    head = None
    if type(cycle) is RequestResponseCycle:
        head = _head(cycle, status, headers, fixed, lines, len(body), more_body)
    if head is None:
        if fixed or lines:
            headers = headers + list(fixed) + pairs(lines)
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": more_body})
        return
    flow = cycle.flow  # type: ignore[union-attr]
    if flow.write_paused and not cycle.disconnected:  # type: ignore[union-attr]
        await flow.drain()
    if cycle.disconnected:  # type: ignore[union-attr]
        return  # as uvicorn's `send` does
    _write(cycle, head, body, more_body)  # type: ignore[arg-type]


def head_and_body_written(
    send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes, fixed: Fixed, lines: bytes
) -> bool:
    """`send_head_and_body` of a whole body when it need not wait (uvicorn's cycle, its transport not
    paused), without a coroutine: True once done; False, nothing done: `send_head_and_body` it is."""
    cycle = getattr(send, "__self__", None)
    if type(cycle) is not RequestResponseCycle or (cycle.flow.write_paused and not cycle.disconnected):
        return False
    head = _head(cycle, status, headers, fixed, lines, len(body), False)
    if head is None:
        return False
    if not cycle.disconnected:  # else nothing is written, as uvicorn's `send` does
        _write(cycle, head, body, False)
    return True


def _head(
    cycle: RequestResponseCycle,
    status: int,
    headers: list[tuple[bytes, bytes]],
    fixed: Fixed,
    lines: bytes,
    size: int,
    more_body: bool,
) -> tuple[list[bytes], int | None] | None:
    """The head's pieces, `headers` then `fixed` then `lines`, and the declared Content-Length (None:
    chunked), or None for uvicorn's path."""
    if (
        cycle.response_started
        or cycle.access_log
        or cycle.chunked_encoding is not None
        or cycle.scope["method"] == "HEAD"
        or status in (204, 304)
    ):
        return None
    fixed_lines = b""
    if fixed:
        known = _FIXED_CHECKED.get(id(fixed))
        checked = known[1] if known is not None and known[0] is fixed else _check_fixed(fixed)
        if checked is None:
            return None
        fixed_lines = checked
    every = cycle.default_headers + headers
    names = tuple(map(_NAME, every))
    at = _NAMES_CHECKED.get(names)
    if at is None:
        at = _check_names(names)
    if at == _REFUSED or HEADER_VALUE_RE.search(b"".join(map(_VALUE, every))):
        return None  # uvicorn refuses it (with its own error) or acts on it
    length: int | None = None
    if at >= 0:
        value = every[at][1]
        if not value.isdigit():
            return None
        length = int(value)
        if size > length or (not more_body and size != length):
            return None
    if not every:
        return [STATUS_LINE[status], fixed_lines, lines], length
    return [STATUS_LINE[status], b"\r\n".join(map(_LINE, every)), b"\r\n", fixed_lines, lines], length


_NAME = itemgetter(0)
_VALUE = itemgetter(1)
_LINE = b": ".join
"""`name: value` of a `(name, value)` header."""
_REFUSED = -2
_NAMES_CHECKED: dict[tuple[bytes, ...], int] = {}
"""The header names of the answers seen so far, in order (a handful: the gateway's own), checked once:
the index of Content-Length among them (-1: none), or `_REFUSED`. Values are checked on every answer."""
_NAMES_KEPT = 256


_FIXED_CHECKED: dict[int, tuple[Fixed, bytes | None]] = {}
"""By id: a `fixed` of `send_head_and_body` and its lines, `name: value\r\n` each (None: uvicorn's path)."""


def _check_fixed(fixed: Fixed) -> bytes | None:
    lines = None
    if _check_names(tuple(map(_NAME, fixed))) == -1 and not HEADER_VALUE_RE.search(
        b"".join(map(_VALUE, fixed))
    ):
        lines = b"".join(map(b"%b: %b\r\n".__mod__, fixed))
    if len(_FIXED_CHECKED) < _NAMES_KEPT:
        _FIXED_CHECKED[id(fixed)] = (fixed, lines)
    return lines


def _check_names(names: tuple[bytes, ...]) -> int:
    """What `_NAMES_CHECKED` keeps for `names` (kept there while it holds fewer than `_NAMES_KEPT`)."""
    joined = b"".join(names)
    at = -1
    if (
        HEADER_RE.search(joined)
        or not joined.islower()
        or _TRANSFER_ENCODING in joined
        or _CONNECTION in joined
        or names.count(_CONTENT_LENGTH) > 1
    ):
        at = _REFUSED
    elif _CONTENT_LENGTH in names:
        at = names.index(_CONTENT_LENGTH)
    if len(_NAMES_CHECKED) < _NAMES_KEPT:
        _NAMES_CHECKED[names] = at
    return at


def _write(
    cycle: RequestResponseCycle, head: tuple[list[bytes], int | None], body: bytes, more_body: bool
) -> None:
    """uvicorn's `send` for the start message and one body message, as one write."""
    content, length = head
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    if not cycle.keep_alive:
        content.append(b"connection: close\r\n")
    if length is None:
        cycle.chunked_encoding = True
        content.append(b"transfer-encoding: chunked\r\n\r\n")
        if body:
            content.extend((b"%x\r\n" % len(body), body, b"\r\n"))
        if not more_body:
            content.append(b"0\r\n\r\n")
    else:
        cycle.chunked_encoding = False
        cycle.expected_content_length = length - len(body)
        content.extend((b"\r\n", body))
    cycle.transport.write(b"".join(content))
    if not more_body:
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()


class CycleSink:
    """The rest of a chunked response written straight to uvicorn's transport (gateway/request/relay.py's
    `ChunkSink`): each piece framed as uvicorn's `send` frames it (`size\\r\\n piece \\r\\n`, the last with
    `0\\r\\n\\r\\n`), one write per piece, the cycle left as `send` leaves it. A client gone is written
    nothing, as `send` does; a full transport (uvicorn's flow control paused) is waited on before more."""

    __slots__ = ("_cycle", "_flow", "_on_end", "_protocol", "_transport")

    def __init__(self, cycle: RequestResponseCycle, on_end: Callable[[], None]) -> None:
        self._cycle = cycle
        self._flow = cycle.flow
        self._transport = cycle.transport
        self._on_end = on_end
        self._protocol: Any = None

    @property
    def paused(self) -> bool:
        """The client's side is full (and the client still there)."""
        return self._flow.write_paused and not self._cycle.disconnected

    def watch_writable(self, on_writable: Callable[[bool], None]) -> bool:
        """Have the server protocol call `on_writable(False)` when the client's side fills and
        `on_writable(True)` when it takes writes again; False when it cannot (not the gateway's protocol)."""
        get_protocol = getattr(self._transport, "get_protocol", None)
        protocol = get_protocol() if get_protocol is not None else None
        if getattr(protocol, WRITABLE_HOOK, False) is not None:
            return False
        setattr(protocol, WRITABLE_HOOK, on_writable)
        self._protocol = protocol
        return True

    def unwatch_writable(self) -> None:
        protocol = self._protocol
        if protocol is not None:
            self._protocol = None
            setattr(protocol, WRITABLE_HOOK, None)

    def write(self, data: bytes) -> bool:
        if self._cycle.disconnected:
            return False
        self._transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return self._flow.write_paused

    async def drain(self) -> None:
        if self._flow.write_paused and not self._cycle.disconnected:
            await self._flow.drain()

    def end(self, data: bytes) -> None:
        self._on_end()
        cycle = self._cycle
        if cycle.disconnected:
            return
        self._transport.write(b"%x\r\n%b\r\n0\r\n\r\n" % (len(data), data) if data else b"0\r\n\r\n")
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            self._transport.close()
        cycle.on_response()


def cycle_sink(send: Any, on_end: Callable[[], None]) -> CycleSink | None:
    """A `CycleSink` for the chunked response `send` has started (`on_end` runs before its last write),
    or None when `send` is not uvicorn's or its response is in another state (then `send` it is)."""
    cycle = getattr(send, "__self__", None)
    if (
        type(cycle) is not RequestResponseCycle
        or not cycle.response_started
        or cycle.response_complete
        or cycle.chunked_encoding is not True
        or cycle.access_log
        or cycle.scope["method"] == "HEAD"
    ):
        return None
    return CycleSink(cycle, on_end)
