"""A calibrated server's front end (vLLM's API server: HTTP, tokenisation): the requests it holds share it.

vLLM's API server is one asyncio process. Requests that arrive together are worked on together and leave
it together (a cohort of 16 sent within 2.4 ms got its first tokens in three bunches, where one queue
taking a request at a time would space them out, one every 2.5 ms: docs/calibrate.md). So the front end
is a processor shared equally by the requests it holds: each needs `seconds` of it alone and gets
1/n of it while n are held. A request that arrives later slows those held down, never the other way
round, so a held request's leave time is only known for sure once it has passed; `enter` returns what
each held request's would be were nothing else to arrive, and callers update theirs on every entry.

The simulator (engine.BatchEngine), the what-if replay (loadtest/whatif/simfleet.py) and the
calibration's replay of its own levels (loadtest/calibrate/refine.py) all use this one front end.
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from backends.sim.scheduler import Group

T = TypeVar("T")


class FrontEnd(Generic[T]):
    """Processor sharing, kept on a virtual clock that runs at 1/n of real time while n are held: a
    request that enters at virtual time v and needs s seconds leaves when the virtual clock reaches v + s."""

    __slots__ = ("_at", "_held", "_order", "_virtual")

    def __init__(self) -> None:
        self._at = 0.0  # real time the virtual clock was last brought to
        self._virtual = 0.0
        self._held: list[tuple[float, int, T]] = []  # (virtual finish, entry order, item), a heap
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._held)

    def enter(self, now: float, seconds: float, item: T) -> list[tuple[T, float]]:
        """`item`, needing `seconds` of the front end alone, arrives at `now`. Returns every request still
        held (this one included) with when it would leave were nothing else to arrive; one that needs no
        time leaves at once and holds nothing."""
        self._advance(now)
        if seconds <= 0:
            return [*self.leaving(), (item, max(now, self._at))]
        heapq.heappush(self._held, (self._virtual + seconds, next(self._order), item))
        return self.leaving()

    def drop(self, item: T) -> list[tuple[T, float]]:
        """`item` goes (its client went away) and no longer shares the front end; returns the rest's
        leave times as `enter` does."""
        kept = [held for held in self._held if held[2] is not item]
        if len(kept) != len(self._held):
            self._held = kept
            heapq.heapify(kept)
        return self.leaving()

    def leaving(self) -> list[tuple[T, float]]:
        """Each held request with when it leaves should nothing else arrive, the first to leave first."""
        at, virtual, count = self._at, self._virtual, len(self._held)
        out: list[tuple[T, float]] = []
        for finish, _, item in sorted(self._held):
            at += (finish - virtual) * count
            virtual, count = finish, count - 1
            out.append((item, at))
        return out

    def _advance(self, now: float) -> None:
        """Bring the clocks to `now`, letting go of the requests that left by then (an arrival stamped a
        little before the last one is taken as arriving with it)."""
        if now <= self._at:
            return
        held = self._held
        while held:
            finish = held[0][0]
            leaves = self._at + (finish - self._virtual) * len(held)
            if leaves > now:
                self._virtual += (now - self._at) / len(held)
                break
            heapq.heappop(held)
            self._at, self._virtual = leaves, finish
        self._at = now


def hand_over(leaving: list[tuple[Group, float]]) -> None:
    """Each group leaves the front end when `leaving` says: its `arrival` at the engine moves there, and
    its `ready` (the arrival plus its admission wait) with it."""
    for group, leaves in leaving:
        group.ready += leaves - group.arrival
        group.arrival = leaves
