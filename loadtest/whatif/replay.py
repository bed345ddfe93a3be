"""The virtual-clock replay: recorded arrivals, the policy engine and the simulated fleet in one process.

Discrete events on one simulated timeline, no HTTP and no sleeping. Each arrival is classified and routed
by the policy engine (`PolicyEngine.choose`, the gateway's own) from what the gateway would know: its
in-flight counts, the engine gauges of the last scrape (every `scrape_interval_s`), and the latency
averages and prompt sizes taught by the requests it saw finish (as gateway/request/pipeline.py does). A
request that finds no room is held, decided again and sent or refused with 429 as the gateway does it
(loadtest/whatif/holds.py). The chosen backend's scheduler (backends/sim/scheduler.py) admits it; each
engine step is priced by the GPU model and applied at its end, exactly as `BatchEngine` runs it.

Speed: a run of decode-only steps with nothing arriving and nothing finishing is applied in one go
(loadtest/whatif/coasting.py): the same steps, durations and token times for everything a report reads.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.models import Backend
from loadtest.client import Outcome
from loadtest.whatif.accesslog import Recorded
from loadtest.whatif.coasting import coast
from loadtest.whatif.flight import Flight, hold
from loadtest.whatif.holds import Held, Holds
from loadtest.whatif.sessions import Sessions
from loadtest.whatif.simfleet import SimBackend
from loadtest.whatif.standins import BlockNames, Profiles
from policies.engine import PolicyEngine
from policies.framework import Decision
from policies.profile import RequestProfile

EMBEDDINGS = ("/v1/embeddings", "embeddings")  # the access log's name for the endpoint (a path in older logs)


@dataclass(slots=True)
class ReplayResult:
    outcomes: list[Outcome]
    duration_s: float
    """Simulated seconds from the first arrival to the last answer."""
    busy_s: dict[str, float]
    """Per backend, simulated seconds its engine spent in steps."""
    steps: int = 0
    limits: Counter[str] = field(default_factory=Counter)
    """What the replay could not model, with counts (see `describe_limits`)."""
    held: int = 0
    """Requests held for room (back-pressure), then sent or refused."""
    refused: int = 0
    """Requests refused with 429 `overloaded` (at once, or after waiting `max_wait_ms`)."""


class Replay:
    def __init__(
        self,
        fleet: Sequence[SimBackend],
        engine: PolicyEngine,
        requests: Sequence[Recorded],
        scrape_interval_s: float = 1.0,
        drain_s: float = 600.0,
        clock_scale: float = 1.0,
        keep_sessions: bool = True,
    ) -> None:
        """`keep_sessions`: a session's next request waits for its previous answer (whatif/sessions.py).
        `clock_scale`: simulated seconds per second of the gateway's scaled clock (its real seconds
        times its `policy.clock_scale`). The load test writes its `time_scale` into the gateway's
        `policy.clock_scale`, so its latency averages are on the fleet's clock and this is 1; a log of a
        gateway that measured a faster-running fleet in real time needs the ratio of the two."""
        self.fleet = fleet
        self.engine = engine
        self.requests = requests
        self.scrape_interval_s = scrape_interval_s
        self.drain_s = drain_s
        self._sim_of: dict[Backend, SimBackend] = {s.backend: s for s in fleet}
        serving: dict[str, list[Backend]] = {}
        for sim in fleet:
            serving.setdefault(sim.model, []).append(sim.backend)
        self._serving = {model: tuple(backends) for model, backends in serving.items()}
        self._events: list[tuple[float, int, SimBackend | Flight | Held]] = []
        self._seq = 0
        self._horizon = math.inf
        self.steps = 0
        self.limits: Counter[str] = Counter()
        self._blocks = BlockNames()
        self.profiles = Profiles()
        self._observed_per_simulated = 1.0 / clock_scale
        self.holds = Holds(engine, self._serving, clock_scale)
        self._outcomes: list[Outcome | None] = [None] * len(requests)
        self._flights: dict[int, Flight] = {}
        self.refused = 0
        self.sessions = Sessions(requests, keep_sessions)

    # --- the loop ------------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        requests, events = self.requests, self._events
        outcomes, flights = self._outcomes, self._flights
        interval = self.scrape_interval_s
        next_scrape = 0.0
        last = requests[-1].at_s if requests else 0.0
        deadline = last + self.drain_s
        i, count = 0, len(requests)
        now = 0.0
        sessions, follows = self.sessions, self.sessions.follows
        while True:
            while i < count and requests[i].index in follows:
                i += 1  # sent when its session's previous request ends
            t_logged, t_released = requests[i].at_s if i < count else math.inf, sessions.next_at()
            t_arrival = min(t_logged, t_released)
            t_event = events[0][0] if events else math.inf
            now = min(t_arrival, t_event)
            if now == math.inf or now > deadline:
                break
            while next_scrape <= now:
                for sim in self.fleet:
                    sim.scrape(next_scrape)
                next_scrape += interval
            if t_arrival <= t_event:
                if t_released < t_logged:
                    self._arrive(sessions.pop(), now)
                    continue
                self._arrive(requests[i], now)
                i += 1
                continue
            self._horizon = min(next_scrape, t_arrival)
            _, _, item = heapq.heappop(events)
            if isinstance(item, SimBackend):
                finished = self._step_end(item, now)
                for done in finished:
                    outcomes[done.request.index] = done.outcome
                    flights.pop(done.request.index, None)
                if finished:
                    self._room_made(now)
            elif isinstance(item, Held):
                if item.queued and item.check_at == now:
                    self._check(item, now)
            else:
                self._fixed_end(item, now)
                outcomes[item.request.index] = item.outcome
                flights.pop(item.request.index, None)
                self._room_made(now)
        for index, flight in flights.items():
            flight.outcome.error = "unfinished at deadline"
            hold(flight, -1)
            outcomes[index] = flight.outcome
        for held in self.holds.waiting():
            held.outcome.error = "unfinished at deadline"
            outcomes[held.request.index] = held.outcome
        for request in requests:  # a session's turn whose previous one had not ended: never sent
            if outcomes[request.index] is None:
                never = Outcome(request.index, request.line.request_class or "default", request.at_s)
                never.error = "unfinished at deadline"
                outcomes[request.index] = never
        return ReplayResult(
            outcomes=[o for o in outcomes if o is not None],
            duration_s=now if now != math.inf else last,
            busy_s={s.backend.name: s.busy_s for s in self.fleet},
            steps=self.steps,
            limits=self.limits,
            held=self.holds.held,
            refused=self.refused,
        )

    def _push(self, when: float, item: SimBackend | Flight | Held) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, item))

    # --- arrivals ------------------------------------------------------------------------------------

    def _arrive(self, request: Recorded, now: float) -> None:
        line = request.line
        outcome = Outcome(request.index, line.request_class or "default", now)
        if line.endpoint in EMBEDDINGS:
            self.limits["embeddings"] += 1
            outcome.error = "not modelled: embeddings"
            self._outcomes[request.index] = outcome
            self.sessions.ended(request.index, now + (line.duration_s or 0.0))  # as long as it took
            return
        serving = self._serving.get(line.model)
        if serving is None:
            self.limits[f"model:{line.model}"] += 1
            outcome.error = "not modelled: unknown model"
            self._outcomes[request.index] = outcome
            self.sessions.ended(request.index, now + (line.duration_s or 0.0))
            return
        profile = self.profiles.of(line)
        decision = self.engine.choose(profile, serving)
        holds = self.holds
        limits = holds.limits(decision.request_class) if decision.candidates else None
        if limits is None or not holds.must_wait(decision, limits):
            self._send(request, profile, decision, outcome, now)
            return
        held = holds.join(request, profile, outcome, decision, limits, now)
        if held is None:  # its class's queue is full: refused at once
            self._refuse(outcome, decision, profile, now)
            return
        self._check(held, now)  # the gateway's wait loop starts at once: the head decides again

    def _send(
        self, request: Recorded, profile: RequestProfile, decision: Decision, outcome: Outcome, now: float
    ) -> None:
        """To the first candidate that takes it (the gateway fails over to the next on a refusal)."""
        line, steps = request.line, request.output_per_choice
        outcome.route = decision.route
        for backend in decision.candidates:
            sim = self._sim_of[backend]
            if not self._fits(sim, line.prompt_tokens, steps, line.n):
                continue
            outcome.backend, outcome.pool, outcome.vendor = backend.name, backend.pool.name, backend.vendor
            estimate = profile.prompt_tokens_estimate
            flight = Flight(request, sim, outcome, steps, None, decision, estimate, now)
            hold(flight)
            self._flights[request.index] = flight
            if sim.scheduler is None:
                flight.ttft_at = now + sim.ttft_s
                self._push(flight.ttft_at + (steps - 1) * sim.tpot_s, flight)
                sim.fixed_open += 1
            else:
                self._submit(sim, flight, now)
            return
        decision.answered(profile.prompt_tokens_estimate)  # the gateway ends the request: out of the estimate
        if decision.candidates or decision.rejected_for_context:
            self.limits["context"] += 1
            outcome.error = "not modelled: longer than any backend's context or KV cache"
        else:
            outcome.error = "no backend: " + (decision.why_none or "")
        outcome.status = 400 if decision.candidates or decision.rejected_for_context else 503
        self._outcomes[request.index] = outcome
        self.sessions.ended(request.index, now)
        self._room_made(now)

    # --- back-pressure ---------------------------------------------------------------------------------

    def _check(self, held: Held, now: float) -> None:
        """One turn of the gateway's wait loop (`Pipeline._room`): past the deadline, refused; the head
        decides again and goes if it has room; otherwise it waits for a wake-up or the next poll."""
        holds = self.holds
        if now >= held.deadline:
            self._wake(holds.leave(held), now)
            self._refuse(held.outcome, held.first, held.profile, now)
            return
        if holds.is_head(held):
            decision, room = holds.decide_again(held)
            if not decision.candidates:  # `decide` raised: the request ends with that error
                self._wake(holds.leave(held), now)
                held.first.answered(held.profile.prompt_tokens_estimate)
                self._send(held.request, held.profile, decision, held.outcome, now)
                return
            if room:
                self._wake(holds.leave(held), now)
                self._send(held.request, held.profile, decision, held.outcome, now)
                return
        held.check_at = holds.next_check(held, now)
        self._push(held.check_at, held)

    def _refuse(self, outcome: Outcome, decision: Decision, profile: RequestProfile, now: float) -> None:
        """429 `overloaded`, counted as the load test's client counts it; the gateway's `end` takes the
        arrival's decision out of the prefill estimate and wakes the waiting heads."""
        outcome.status = 429
        outcome.error = "refused (429)"
        outcome.e2e = now - outcome.sent_at
        self._outcomes[outcome.index] = outcome
        self.sessions.ended(outcome.index, now)
        self.refused += 1
        decision.answered(profile.prompt_tokens_estimate)
        self._room_made(now)

    def _wake(self, head: Held | None, now: float) -> None:
        """A waiter is told to check at once (it is due now; an earlier pending check is superseded)."""
        if head is not None and head.check_at != now:
            head.check_at = now
            self._push(now, head)

    def _room_made(self, now: float) -> None:
        """A request ended: the head of every queue checks again (`Pipeline._room_made`)."""
        for head in self.holds.heads():
            self._wake(head, now)

    def _fits(self, sim: SimBackend, prompt: int, steps: int, n: int) -> bool:
        if prompt + steps > sim.backend.max_model_len:
            return False
        capacity = sim.kv_capacity_tokens
        return capacity is None or prompt + n * steps <= capacity

    def _submit(self, sim: SimBackend, flight: Flight, now: float) -> None:
        scheduler = sim.scheduler
        assert scheduler is not None
        line = flight.request.line
        n = max(1, line.n)
        reasons = ["length" if flight.steps == line.max_tokens else "stop"] * n
        hashes = self._blocks.names(flight.request, scheduler.limits.block_size)
        group = sim.enter(line.prompt_tokens, hashes, [flight.steps] * n, reasons, now)
        group.waiter = flight
        if not sim.stepping:
            self._start_step(sim, now)

    # --- the engine ----------------------------------------------------------------------------------

    def _start_step(self, sim: SimBackend, start: float) -> None:
        scheduler, perf = sim.scheduler, sim.perf
        assert scheduler is not None and perf is not None
        plan = scheduler.plan(start)
        duration = perf.step_seconds(plan.work, start)
        if duration <= 0:  # idle until the next submit, or until a request leaves a calibrated front end
            ready = sim.leaves_front_end(start)
            sim.stepping, sim.plan = ready is not None, None
            if ready is not None:
                self._push(ready, sim)
            return
        sim.stepping = True
        sim.plan = plan
        sim.busy_s += duration
        self.steps += 1
        self._push(start + duration, sim)

    def _step_end(self, sim: SimBackend, end: float) -> list[Flight]:
        scheduler = sim.scheduler
        assert scheduler is not None
        finished: list[Flight] = []
        if sim.plan is not None:  # None: the end of coasted steps, already applied
            for group in scheduler.apply(sim.plan, end):
                flight: Flight = group.waiter
                if flight.ttft_at is None:
                    flight.ttft_at = group.first_token_at
                    if flight.request.line.stream:
                        flight.answered()
                if group.done:
                    self._finish(flight, end)
                    finished.append(flight)
        if not scheduler.has_work():
            sim.stepping = False
            return finished
        coasted_to = self._coast(sim, end)
        if coasted_to > end:
            # The last coasted step ends past the next arrival: the next step is planned when it ends,
            # after that arrival has joined the queue (as the engine plans it), not now without it.
            sim.plan = None
            self._push(coasted_to, sim)
        else:
            self._start_step(sim, end)
        return finished

    def _coast(self, sim: SimBackend, start: float) -> float:
        """Coasted decode steps up to the next arrival or scrape (loadtest/whatif/coasting.py)."""
        # a session's next request, released by an answer that ended in this very step, is an arrival too
        horizon = min(self._horizon, self.sessions.next_at())
        if self.holds.held_now and self._events:
            # a held request may be sent whenever anything happens (a request ends, a poll): stop there
            horizon = min(horizon, self._events[0][0])
        t, steps = coast(sim, start, horizon)
        self.steps += steps
        return t

    # --- the end of a request ------------------------------------------------------------------------

    def _fixed_end(self, flight: Flight, end: float) -> None:
        flight.sim.fixed_open -= 1
        self._finish(flight, end)

    def _finish(self, flight: Flight, end: float) -> None:
        """What the gateway's `account` and `observe` see, and what the load-test client measures."""
        outcome = flight.outcome
        line = flight.request.line
        backend = flight.sim.backend
        hold(flight, -1)
        self.sessions.ended(flight.request.index, end)
        flight.answered()  # a whole answer (or a stream on a fixed-latency backend): no-op if told already
        n = max(1, line.n)
        tokens = flight.steps * n
        outcome.status = 200
        outcome.prompt_tokens = line.prompt_tokens
        outcome.completion_tokens = tokens
        outcome.e2e = end - outcome.sent_at
        ttft = outcome.ttft = (flight.ttft_at if flight.ttft_at is not None else end) - outcome.sent_at
        if not line.stream:  # the load test's client sees a whole answer: its time is its TTFT
            ttft = outcome.ttft = outcome.e2e
            outcome.tpot = outcome.e2e / flight.steps
        elif flight.steps > 1:
            outcome.tpot = (outcome.e2e - ttft) / (flight.steps - 1)
        # gateway/request/pipeline.py observe(), on the gateway's clock and from when it sent the request
        seen = self._observed_per_simulated
        per_choice = flight.steps  # observe() times one choice's tokens: the n choices decode side by side
        held = flight.forwarded_at - outcome.sent_at
        if line.stream:
            tpot = (outcome.e2e - ttft) / (per_choice - 1) * seen if per_choice > 1 else None
            backend.observed.add((ttft - held) * seen, tpot)
        elif per_choice >= 16:
            backend.observed.add(None, (outcome.e2e - held) / per_choice * seen)
        self.profiles.counted(line)
