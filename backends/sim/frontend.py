"""A calibrated server's front end (vLLM's API server: HTTP, tokenisation): one request at a time.

Requests that arrive together queue for it and leave one after the other; requests that arrive spread
out hardly wait. The simulator (engine.BatchEngine), the what-if replay (loadtest/whatif/simfleet.py)
and the calibration's replay of its own levels (loadtest/calibrate/refine.py) all use this one queue.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class FrontEnd:
    free_at: float = 0.0
    """When it is done with the requests it holds."""

    def leave(self, now: float, seconds: float) -> float:
        """When a request that arrives at `now` and needs `seconds` of it leaves it for the engine."""
        if seconds <= 0:
            return now
        self.free_at = max(now, self.free_at) + seconds
        return self.free_at
