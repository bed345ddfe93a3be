"""What a routing policy is made of, and what it answers.

One scheduling cycle per request (policies/engine.py):

    classify  the request's class: the first matching rule of the policy file, else `default`
    filter    keep the backends of the class's route that can serve it (each Filter drops some)
    score     every Scorer rates every remaining backend in 0..1; the route's weights combine them
    pick      the Picker orders them: first choice, then the fallbacks to try

Plugins are synchronous and pure: they read the snapshot of backend state already on each `Backend`
(in-flight requests, scraped engine load, observed latency, measured cost) and do no I/O. The engine, not
the plugin, measures how long routing takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

if TYPE_CHECKING:
    from backends.models import Backend
    from policies.config import Route
    from policies.profile import RequestProfile


@dataclass(slots=True)
class RouteContext:
    """Everything a plugin may read about the request being routed."""

    profile: RequestProfile
    request_class: str
    route: Route
    tiers: dict[Backend, int]
    """0 for a backend in a preferred pool, 1 for a fallback pool."""
    predicted_ttft: list[float] | None = None
    """Predicted seconds to first token per candidate (policies/predict.py), when the route needs them."""
    predicted_tpot: list[float] | None = None


class Filter(Protocol):
    """Drops backends that must not get the request; says why, for explanations."""

    name: str

    def keep(self, ctx: RouteContext, backend: Backend) -> str | None:
        """None to keep the backend, else the reason it is dropped."""
        ...


class Scorer(Protocol):
    """Rates candidates in 0..1 (1 best); sees all of them, so it may compare them with each other.

    Every scorer declares its two capabilities as class attributes; the engine reads them once, when the
    policy is loaded, and refuses a scorer that leaves either out.
    """

    name: str
    scores_in_unit_range: ClassVar[bool]
    """True when its formula cannot leave 0..1 (the built-ins'): the engine then does not clamp."""
    reads_predictions: ClassVar[bool]
    """True when it reads `RouteContext.predicted_ttft` / `predicted_tpot`: the engine then computes them
    for every request of the route, SLO or not."""

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> Sequence[float]: ...


class Picker(Protocol):
    """Orders the candidates; the lists are parallel to `candidates`. Returns indices, best first."""

    name: str

    def order(
        self,
        ctx: RouteContext,
        candidates: Sequence[Backend],
        tiers: Sequence[int],
        scores: Sequence[float],
        can_take_more: Sequence[bool],
    ) -> list[int]: ...


class PendingPrefill(Protocol):
    """Where a decision counted its request's prompt as not yet prefilled (policies/predict.py)."""

    def answered(self, backend: Backend, prompt_tokens: int) -> None: ...


@dataclass(slots=True)
class Decision:
    candidates: list[Backend]
    """Backends to try, best first; empty when nothing fits."""
    route: str
    request_class: str = "default"
    why_none: str | None = None
    """When `candidates` is empty: why, in words a client can act on."""
    rejected_for_context: bool = False
    hold: bool = False
    """A `shed` route found no candidate able to take more work: hold the request (back-pressure), then
    refuse it, rather than queue it where it would crowd the classes that are not shed."""
    counted: Backend | None = None
    """The backend whose prefill estimate counts this request until the request is answered (then
    `answered` takes it out of `pending`, once)."""
    pending: PendingPrefill | None = None

    def answered(self, prompt_tokens: int) -> None:
        counted, pending = self.counted, self.pending
        if counted is not None and pending is not None:
            self.counted = None
            pending.answered(counted, prompt_tokens)


class Router(Protocol):
    name: str

    def choose(self, profile: RequestProfile, serving: Sequence[Backend]) -> Decision: ...
