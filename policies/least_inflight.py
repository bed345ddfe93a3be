"""The built-in policy until operators configure one: any healthy backend that can hold the request,
fewest requests in flight first, ties broken round-robin so idle backends share the load."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from policies.framework import Decision

if TYPE_CHECKING:
    from backends.models import Backend
    from policies.profile import RequestProfile


class LeastInflight:
    name = "least-inflight"

    def __init__(self) -> None:
        self._turn = 0

    def choose(self, profile: RequestProfile, serving: Sequence[Backend]) -> Decision:
        fits = [b for b in serving if b.max_model_len >= profile.context_needed]
        if not fits:
            longest = max((b.max_model_len for b in serving), default=0)
            return Decision(
                [],
                self.name,
                why_none=(
                    f"the request needs about {profile.context_needed} tokens of context "
                    f"(estimated prompt plus max_tokens) but the longest served for this model is {longest}"
                ),
                rejected_for_context=True,
            )
        healthy = [b for b in fits if b.healthy]
        if not healthy:
            return Decision([], self.name, why_none=f"all {len(fits)} backends that fit are unhealthy")
        self._turn += 1
        count = len(healthy)
        turn = self._turn
        ranked = sorted(range(count), key=lambda i: (healthy[i].inflight, (i - turn) % count))
        return Decision([healthy[i] for i in ranked], self.name)
