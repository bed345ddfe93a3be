"""A one-shot timer for write-behind batches: armed by a batch's first item, it calls `flush` once."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class BatchTimer:
    __slots__ = ("_delay", "_flush", "_handle", "loop")

    def __init__(self, delay: float, flush: Callable[[], None]) -> None:
        self._delay = delay
        self._flush = flush
        self._handle: asyncio.TimerHandle | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop found by the first `arm` (None until then)."""

    def arm(self) -> bool:
        """Schedule `flush` in `delay` seconds unless it already is; False when no event loop runs (at
        start-up or shutdown, in synchronous tests), so the caller flushes itself."""
        if self._handle is not None:
            return True
        loop = self.loop
        if loop is None:
            try:
                loop = self.loop = asyncio.get_running_loop()
            except RuntimeError:
                return False
        self._handle = loop.call_later(self._delay, self._fire)
        return True

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _fire(self) -> None:
        self._handle = None
        self._flush()
