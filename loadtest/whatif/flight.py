"""One request in flight in the replay, and the gateway's in-flight counts it holds on its backend."""

from __future__ import annotations

from dataclasses import dataclass

from loadtest.client import Outcome
from loadtest.whatif.accesslog import Recorded
from loadtest.whatif.simfleet import SimBackend
from policies.framework import Decision


@dataclass(slots=True)
class Flight:
    request: Recorded
    sim: SimBackend
    outcome: Outcome
    steps: int
    ttft_at: float | None = None
    decision: Decision | None = None
    """Its routing decision, told when the gateway would see the answer start (`Decision.answered`)."""
    prompt_estimate: int = 0
    forwarded_at: float = 0.0
    """When the gateway sent it (its arrival, unless held for room): its latency figures count from it."""

    def answered(self) -> None:
        """The gateway's pipeline calls this at a stream's first chunk, or with a whole answer."""
        if self.decision is not None:
            self.decision.answered(self.prompt_estimate)


def hold(flight: Flight, sign: int = 1) -> None:
    """The gateway's `hold` (`sign` -1: `release`): in flight, its n seats, and by class, with its tokens."""
    backend, cls = flight.sim.backend, flight.decision.request_class if flight.decision else ""
    backend.inflight += sign
    backend.inflight_seqs += sign * flight.request.line.n
    by_class, tokens = backend.inflight_by_class, backend.prompt_tokens_by_class
    by_class[cls] = by_class.get(cls, 0) + sign
    tokens[cls] = tokens.get(cls, 0) + sign * flight.prompt_estimate
