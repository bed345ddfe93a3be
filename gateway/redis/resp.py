"""The RESP subset `script_client` speaks: arguments encoded as bulk strings, and the replies a script
(or `CLUSTER SLOTS`) answers: bulk strings, integers, arrays, simple strings and errors."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Any, Final

Reply = Any
"""bytes, int, None, a list of replies, or a `ScriptReplyError`."""
OnReply = Callable[[Reply | BaseException], None]


class _Incomplete(enum.Enum):
    INCOMPLETE = enum.auto()


INCOMPLETE: Final = _Incomplete.INCOMPLETE
"""What `parse` answers when the buffer does not hold the whole reply yet."""


class ScriptReplyError(Exception):
    """An error Redis answered (`-ERR ...`)."""


def bulk(value: bytes | str | int) -> bytes:
    """One argument in RESP (`$<len>\\r\\n<data>\\r\\n`)."""
    data = value if isinstance(value, bytes) else str(value).encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


def bulk_int(value: int) -> bytes:
    data = b"%d" % value
    return b"$%d\r\n%s\r\n" % (len(data), data)


def command(*args: bytes | str | int) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(bulk(a) for a in args)


def parse(buf: bytearray, pos: int) -> tuple[Reply, int] | _Incomplete:
    end = buf.find(b"\r\n", pos)
    if end < 0:
        return INCOMPLETE
    kind, line = buf[pos], buf[pos + 1 : end]
    if kind == 36:  # $ bulk string
        size = int(line)
        if size < 0:
            return None, end + 2
        stop = end + 2 + size
        if len(buf) < stop + 2:
            return INCOMPLETE
        return bytes(buf[end + 2 : stop]), stop + 2
    if kind == 42:  # * array
        size, pos = int(line), end + 2
        items: list[Reply] = []
        for _ in range(max(size, 0)):
            parsed = parse(buf, pos)
            if parsed is INCOMPLETE:
                return INCOMPLETE
            item, pos = parsed
            items.append(item)
        return (items if size >= 0 else None), pos
    if kind == 58:  # : integer
        return int(line), end + 2
    if kind == 45:  # - error
        return ScriptReplyError(line.decode(errors="replace")), end + 2
    return bytes(line), end + 2  # + simple string (and RESP3 types a script never answers)


async def read_replies(reader: asyncio.StreamReader, count: int) -> list[Reply]:
    """`count` replies from `reader` (a short-lived connection: `cluster_slots.slot_owner`)."""
    buf, pos = bytearray(), 0
    replies: list[Reply] = []
    while len(replies) < count:
        parsed = parse(buf, pos)
        if parsed is INCOMPLETE:
            data = await reader.read(65536)
            if not data:
                raise ConnectionError("closed by Redis")
            buf += data
            continue
        reply, pos = parsed
        replies.append(reply)
    return replies
