"""A calibrated server's front end (vLLM's API server: HTTP, tokenisation): one request at a time.

Requests that arrive together queue for it and leave one after the other; requests that arrive spread
out hardly wait. How long each needs of it varies around the profile's mean by its `request_cv` (a gamma
draw with that coefficient of variation, from the front end's own seeded generator, so a replay gives the
same answer every time): a real front end shares its process and its cores with the streams it serves,
and a request that comes when they are busy waits longer (docs/calibrate.md, 2026-11-28). The simulator
(engine.BatchEngine), the what-if replay (loadtest/whatif/simfleet.py) and the calibration's replay of
its own levels (loadtest/calibrate/refine.py) all use this one queue.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass(slots=True)
class FrontEnd:
    cv: float = 0.0
    """The spread of a request's time in it, over its mean (StepFit.request_cv)."""
    seed: int = 0
    free_at: float = 0.0
    """When it is done with the requests it holds."""
    _draws: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._draws = random.Random(self.seed)

    def leave(self, now: float, seconds: float) -> float:
        """When a request that arrives at `now` and needs `seconds` of it on average leaves it for the
        engine."""
        if seconds <= 0:
            return now
        if self.cv > 0:
            shape = 1.0 / (self.cv * self.cv)
            seconds *= self._draws.gammavariate(shape, 1.0 / shape)
        self.free_at = max(now, self.free_at) + seconds
        return self.free_at
