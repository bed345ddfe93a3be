"""A calibrated server's slow spells on the simulator's clock (backends/calibrated.py, `Pace`).

Time is cut into spells of `spell_s`; each spell draws one of the profile's step-time factors (read
between its quantiles), and every step that starts in it takes its model's time times that factor. The
draw is a function of the seed and the spell's number only, so a replay gives the same answer every time
and two backends with different seeds have spells of their own, as two servers do.
"""

from __future__ import annotations

import math
import random
import zlib

from backends.calibrated import Pace


def spell_seed(backend: str, draw: int) -> int:
    """The seed of a backend's spells: its own (by name), and another for each draw of them."""
    return zlib.crc32(f"{backend}/{draw}".encode())


class Spells:
    def __init__(self, pace: Pace, seed: int = 0) -> None:
        self._spell_s = pace.spell_s
        self._factors = pace.factors
        self._seed = seed
        self._spell: int | None = None
        self._factor = 1.0

    def factor(self, at: float) -> float:
        """The step-time factor of the spell that `at` (seconds, the simulator's clock) falls in."""
        spell = math.floor(at / self._spell_s)
        if spell != self._spell:
            self._spell = spell
            self._factor = self._draw(random.Random(self._seed * 1_000_003 + spell).random())
        return self._factor

    def _draw(self, u: float) -> float:
        """The factor at quantile `u`: the factors stand at the middles of equal shares, linear between."""
        factors = self._factors
        at = u * len(factors) - 0.5
        if at <= 0:
            return factors[0]
        below = int(at)
        if below >= len(factors) - 1:
            return factors[-1]
        return factors[below] + (factors[below + 1] - factors[below]) * (at - below)
