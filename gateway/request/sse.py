"""Server-sent events from a backend, relayed to the client as they arrive.

The relay reads only what accounting needs: the last usage chunk (vLLM's usage is cumulative, so the
last one is the total, never a sum). The gateway always asks the backend for usage; when the client did
not, the usage chunk is dropped on the way. Events are scanned, not parsed: only an event that mentions
`"usage"` is decoded.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from gateway.openai.responses import Usage, usage_decoder

if TYPE_CHECKING:
    from gateway.errors import GatewayError

_EVENT_END = b"\n\n"
_USAGE_KEY = b'"usage"'


class SseRelay:
    __slots__ = ("_keep_usage", "_tail", "events", "failed", "usage")

    def __init__(self, keep_usage_chunk: bool) -> None:
        self._keep_usage = keep_usage_chunk
        self._tail = b""
        self.usage: Usage | None = None
        self.events = 0
        self.failed: GatewayError | None = None

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the backend; return the complete events to send on (possibly empty)."""
        if self._tail:
            data = self._tail + data
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += 2
        complete, self._tail = data[:end], data[end:]
        self.events += complete.count(_EVENT_END)
        if _USAGE_KEY not in complete:
            return complete
        return self._take_usage(complete)

    def flush(self) -> bytes:
        """What is left when the backend closes the stream (an unterminated last event)."""
        tail, self._tail = self._tail, b""
        return tail

    def _take_usage(self, complete: bytes) -> bytes:
        kept: list[bytes] = []
        for event in complete.split(_EVENT_END)[:-1]:
            if _USAGE_KEY in event and event.startswith(b"data: {"):
                try:
                    chunk = usage_decoder.decode(event[6:])
                except msgspec.DecodeError:
                    chunk = None
                if chunk is not None and chunk.usage is not None:
                    self.usage = chunk.usage
                    if not chunk.choices and not self._keep_usage:
                        continue
            kept.append(event + _EVENT_END)
        return b"".join(kept)
