"""Fixed timing for the simulated engine: the same delays for every request (`engine.FixedEngine`).

The GPU performance model (`perf`, `scheduler`, `engine.BatchEngine`) replaces it when a profile is set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class Timing(Protocol):
    def ttft(self, prompt_tokens: int) -> float:
        """Seconds from accepting a request to its first output token."""
        ...

    def tpot(self) -> float:
        """Seconds between two output tokens of one request."""
        ...


@dataclass(frozen=True, slots=True)
class FixedTiming:
    """The same delays for every request, whatever the load."""

    ttft_ms: float = 20.0
    tpot_ms: float = 5.0

    def ttft(self, prompt_tokens: int) -> float:
        return self.ttft_ms / 1000.0

    def tpot(self) -> float:
        return self.tpot_ms / 1000.0
