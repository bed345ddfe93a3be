"""Back-pressure on the virtual clock: the gateway's hold of a request whose class has no room, replayed.

The gateway (gateway/request/pipeline.py `_room`, gateway/request/backpressure.py) holds a request of a
route with `backpressure:` (or `shed: true`) when its decision has no room (`no_room`: the shed route found
no candidate able to take more work, or every candidate is saturated), or when others of its class are
already waiting. It joins its class's queue (`max_queued`, else 429 at once), best priority first. The head
of the queue decides again at once, then whenever a request ends (or a waiter leaves) and at least every
`POLL_S`; it goes as soon as a decision has room. At `max_wait_ms` after it joined, a waiter is refused
(429 `overloaded`). Waiters behind the head only wait for their turn or their deadline.

Times here are simulated seconds: the gateway's waits are on its own clock, `clock_scale` simulated
seconds per second of it (a time-scaled load test runs its fleet that many times faster).
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

from backends.models import Backend
from gateway.request.backpressure import POLL_S, PRIORITY, no_room
from loadtest.client import Outcome
from loadtest.whatif.accesslog import Recorded
from policies.config import Backpressure, Saturation
from policies.engine import PolicyEngine
from policies.framework import Decision
from policies.profile import RequestProfile


@dataclass(eq=False, slots=True)
class Held:
    """A request waiting for room: what it was routed with on arrival, and when it gives up."""

    request: Recorded
    profile: RequestProfile
    outcome: Outcome
    first: Decision
    """The decision made on arrival: the one the gateway's `end` answers if the request is refused."""
    deadline: float
    key: tuple[int, int]
    check_at: float = -1.0
    """When its next check is due (a check popped at another time was superseded)."""
    queued: bool = True

    def __lt__(self, other: Held) -> bool:
        return self.key < other.key


@dataclass(frozen=True, slots=True)
class HoldLimits:
    saturation: Saturation
    backpressure: Backpressure


class Holds:
    """The classes' queues of waiting requests, best first. The replay (loadtest/whatif/replay.py) runs the
    gateway's wait loop on its clock: `must_wait` on arrival, `join`, then at each check `decide_again`
    (the head), `leave`, or `next_check`; `heads` when a request ends."""

    def __init__(
        self, engine: PolicyEngine, serving: dict[str, tuple[Backend, ...]], clock_scale: float = 1.0
    ) -> None:
        self.engine = engine
        self.serving = serving
        self.clock_scale = clock_scale
        self.poll_s = POLL_S * clock_scale
        self.queues: dict[str, list[Held]] = {}
        self._order = itertools.count()
        self._limits: dict[str, HoldLimits | None] = {}
        self.held = 0
        """Requests that waited for room (served or refused)."""

    def limits(self, request_class: str) -> HoldLimits | None:
        """The class's back-pressure, as the gateway resolves it (None: never held)."""
        if request_class not in self._limits:
            route = self.engine.loaded.policy.routes.get(request_class)
            if route is None or route.backpressure is None:
                self._limits[request_class] = None
            else:
                self._limits[request_class] = HoldLimits(route.saturation, route.backpressure)
        return self._limits[request_class]

    def must_wait(self, decision: Decision, limits: HoldLimits) -> bool:
        return bool(self.queues.get(decision.request_class)) or no_room(decision, limits.saturation)

    def join(
        self,
        request: Recorded,
        profile: RequestProfile,
        outcome: Outcome,
        decision: Decision,
        limits: HoldLimits,
        now: float,
    ) -> Held | None:
        """The request joins its class's queue; None when the queue is full (refused at once)."""
        queue = self.queues.setdefault(decision.request_class, [])
        if len(queue) >= limits.backpressure.max_queued:
            return None
        rank = PRIORITY.get(profile.priority or "", 1)
        deadline = now + limits.backpressure.max_wait_ms / 1000.0 * self.clock_scale
        held = Held(request, profile, outcome, decision, deadline, (rank, next(self._order)))
        bisect.insort(queue, held)
        self.held += 1
        return held

    def is_head(self, held: Held) -> bool:
        queue = self.queues[held.first.request_class]
        return bool(queue) and queue[0] is held

    def leave(self, held: Held) -> Held | None:
        """Out of its queue (sent or refused); returns the new head, which the gateway wakes at once."""
        queue = self.queues[held.first.request_class]
        queue.remove(held)
        held.queued = False
        return queue[0] if queue else None

    @property
    def held_now(self) -> bool:
        """Whether any request is waiting for room."""
        return any(self.queues.values())

    def waiting(self) -> list[Held]:
        return [h for queue in self.queues.values() for h in queue]

    def heads(self) -> list[Held]:
        """The head of every queue: a request ended (`Pipeline._room_made` wakes them all)."""
        return [queue[0] for queue in self.queues.values() if queue]

    def next_check(self, held: Held, now: float) -> float:
        """After a check that found no room (or not its turn): the next poll, or the deadline."""
        if not self.is_head(held):
            return held.deadline  # behind the head: woken when it becomes the head, else refused then
        return min(now + self.poll_s, held.deadline)

    def decide_again(self, held: Held) -> tuple[Decision, bool]:
        """The head's decision now, and whether it has room (as `_room` decides it)."""
        limits = self.limits(held.first.request_class)
        assert limits is not None
        decision = self.engine.choose(held.profile, self.serving[held.profile.model])
        return decision, bool(decision.candidates) and not no_room(decision, limits.saturation)
