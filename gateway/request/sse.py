"""Server-sent events from a backend, relayed to the client as they arrive.

The relay reads only what accounting needs: the last usage chunk (vLLM's usage is cumulative, so the
last one is the total, never a sum). The gateway always asks the backend for usage; when the client did
not, the usage chunk is dropped on the way. Events are scanned, not parsed: only an event that mentions
`"usage"` is decoded.

Per byte relayed the relay does one scan (for `"usage"`); the events are counted only when someone asks
(`events`: accounting asks only for a stream that ended without usage), from the blocks kept since the
last count, at most `COUNT_AFTER` bytes of them (past that they are counted at once and let go). A block
that ends on an event boundary is passed on as it came, not copied.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from gateway.openai.responses import Usage, usage_decoder

if TYPE_CHECKING:
    from gateway.openai.errors import GatewayError

_EVENT_END = b"\n\n"
_USAGE_KEY = b'"usage"'
_NULL_VALUE = b":null"
_TEXT_COMPLETION = b'"text_completion"'
COUNT_AFTER = 128 * 1024
"""Bytes of relayed events kept uncounted at most (references to blocks already passed on)."""


class SseRelay:
    __slots__ = (
        "_counted",
        "_keep_usage",
        "_started",
        "_tail",
        "_uncounted",
        "_uncounted_bytes",
        "cost_of",
        "failed",
        "usage",
    )

    def __init__(self, keep_usage_chunk: bool) -> None:
        self._keep_usage = keep_usage_chunk
        self._tail = b""
        self._started = False
        self._counted = 0
        self._uncounted: list[bytes] = []
        self._uncounted_bytes = 0
        self.usage: Usage | None = None
        self.failed: GatewayError | None = None
        self.cost_of: Callable[[Usage], float] | None = None
        """Set when the client asked for usage: its final usage event gets `switchyard_cost_usd`."""

    @property
    def events(self) -> int:
        """Complete events relayed so far (the usage chunk and `[DONE]` included)."""
        if self._uncounted:
            self._count()
        return self._counted

    def _count(self) -> None:
        self._counted += sum([block.count(_EVENT_END) for block in self._uncounted])
        self._uncounted.clear()
        self._uncounted_bytes = 0

    def feed(self, data: bytes) -> bytes:
        """Take bytes from the backend; return the complete events to send on (possibly empty)."""
        if self._tail:
            data = self._tail + data
        end = data.rfind(_EVENT_END)
        if end < 0:
            self._tail = data
            return b""
        end += 2
        if end == len(data):
            complete, self._tail = data, b""
        else:
            complete, self._tail = data[:end], data[end:]
        if not self._started:
            self._started = True
            if complete.find(_TEXT_COMPLETION, 0, complete.find(_EVENT_END)) >= 0:
                # Accounting discounts one event for a chat stream's role chunk; /v1/completions has none.
                self._counted = 1
        self._uncounted.append(complete)
        self._uncounted_bytes += len(complete)
        if self._uncounted_bytes > COUNT_AFTER:
            self._count()
        at = complete.find(_USAGE_KEY)
        if at < 0:
            return complete
        return self._take_usage(complete, at)

    def error_event(self, error: GatewayError) -> bytes:
        """The event that ends a stream the backend failed after it started."""
        return error.to_sse()

    def flush(self) -> bytes:
        """What is left when the backend closes the stream (an unterminated last event)."""
        tail, self._tail = self._tail, b""
        return tail

    def _take_usage(self, complete: bytes, at: int) -> bytes:
        """Decode only the events that mention usage (a whole stream often arrives in one read, and
        splitting all of its events cost more than the rest of the relay); drop the usage-only chunk
        unless the client asked for it."""
        kept: list[bytes] = []
        copied_to = 0
        while at >= 0:
            start = complete.rfind(_EVENT_END, 0, at)
            start = 0 if start < 0 else start + 2
            end = complete.find(_EVENT_END, at) + 2  # `complete` ends with an event end
            if not complete.startswith(_NULL_VALUE, at + len(_USAGE_KEY)) and complete.startswith(
                b"data: {", start
            ):
                try:
                    chunk = usage_decoder.decode(complete[start + 6 : end - 2])
                except msgspec.DecodeError:
                    chunk = None
                if chunk is not None and chunk.usage is not None:
                    self.usage = chunk.usage
                    if not chunk.choices and not self._keep_usage:
                        kept.append(complete[copied_to:start])
                        copied_to = end
                    elif not chunk.choices and self.cost_of is not None:
                        brace = complete.find(b"{", at + len(_USAGE_KEY), end)
                        if brace > 0:
                            cost = b'"switchyard_cost_usd":%.10f,' % self.cost_of(chunk.usage)
                            kept.append(complete[copied_to : brace + 1])
                            kept.append(cost)
                            copied_to = brace + 1
            at = complete.find(_USAGE_KEY, end)
        if not copied_to:
            return complete
        kept.append(complete[copied_to:])
        return b"".join(kept)
