"""A one-line progress bar on stderr (no dependency): redrawn in place on a terminal, every 10 s in logs."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, label: str, total: int, duration_s: float, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = total
        self.duration_s = duration_s
        self.stream = stream if stream is not None else sys.stderr
        self._tty = self.stream.isatty()
        self._last = 0.0
        self._began = time.monotonic()

    def update(self, sent: int, done: int, inflight: int, errors: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < (0.25 if self._tty else 10.0):
            return
        self._last = now
        width = 24
        filled = int(width * done / self.total) if self.total else width
        bar = "#" * filled + "-" * (width - filled)
        line = (
            f"{self.label:<14} [{bar}] {done}/{self.total} done, {sent - done} in flight, "
            f"{errors} errors, {now - self._began:5.1f}s/{self.duration_s:.0f}s"
        )
        if self._tty:
            self.stream.write("\r" + line + "\x1b[K")
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self._tty:
            self.stream.write("\n")
            self.stream.flush()
