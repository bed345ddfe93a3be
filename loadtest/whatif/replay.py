"""The virtual-clock replay: recorded arrivals, the policy engine and the simulated fleet in one process.

Discrete events on one simulated timeline, no HTTP and no sleeping. Each arrival is classified and routed
by the policy engine (`PolicyEngine.choose`, the gateway's own) from the backend state the gateway would
hold: its in-flight counts, the engine gauges of the last scrape (every `scrape_interval_s`) and the
latency averages fed by the requests it saw finish (`observe`, as gateway/request/pipeline.py does). The
chosen backend's scheduler (backends/sim/scheduler.py) admits it; each engine step is priced by the GPU
performance model and applied at its end, exactly as `BatchEngine` runs it over HTTP.

Speed: a run of decode-only steps with nothing arriving and nothing finishing (`_coast`) is applied in
one go: the same steps, the same durations, the same token times for everything a report reads.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.models import Backend
from backends.sim.perf import StepWork
from backends.sim.scheduler import Group
from loadtest.client import Outcome
from loadtest.whatif.accesslog import Recorded
from loadtest.whatif.simfleet import SimBackend
from policies.engine import PolicyEngine
from policies.framework import Decision
from policies.profile import RequestProfile

EMBEDDINGS = ("/v1/embeddings", "embeddings")
"""How the access log names the embeddings endpoint (`embeddings`; a path in older logs)."""
PREFIX_BLOCK_CHARS = 1024
"""Characters per `prefix` hash of the access log (gateway/telemetry/logs.py)."""


class _AffinityKey:
    """Stands in for the prompt: `prefix-affinity` hashes what `prompt_prefix` returns, so requests that
    shared a key when recorded share one here (the same backend for the same key)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def prompt_prefix(self, chars: int) -> str:
        return self.key


@dataclass(slots=True)
class _Flight:
    request: Recorded
    sim: SimBackend
    outcome: Outcome
    steps: int
    ttft_at: float | None = None
    decision: Decision | None = None
    """Its routing decision, told when the gateway would see the answer start (`Decision.answered`)."""
    prompt_estimate: int = 0

    def answered(self) -> None:
        """The gateway's pipeline calls this at a stream's first chunk, or with a whole answer."""
        if self.decision is not None:
            self.decision.answered(self.prompt_estimate)


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


class Replay:
    def __init__(
        self,
        fleet: Sequence[SimBackend],
        engine: PolicyEngine,
        requests: Sequence[Recorded],
        scrape_interval_s: float = 1.0,
        drain_s: float = 600.0,
        clock_scale: float = 1.0,
    ) -> None:
        """`clock_scale`: simulated seconds per second of the gateway's scaled clock (its real seconds
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
        self._events: list[tuple[float, int, SimBackend | _Flight]] = []
        self._seq = 0
        self._horizon = math.inf
        self.steps = 0
        self.limits: Counter[str] = Counter()
        self._tokens_per_hash: dict[str, float] = {}
        self._observed_per_simulated = 1.0 / clock_scale

    # --- the loop ------------------------------------------------------------------------------------

    def run(self) -> ReplayResult:
        requests, events = self.requests, self._events
        outcomes: list[Outcome | None] = [None] * len(requests)
        flights: dict[int, _Flight] = {}
        interval = self.scrape_interval_s
        next_scrape = 0.0
        last = requests[-1].at_s if requests else 0.0
        deadline = last + self.drain_s
        i, count = 0, len(requests)
        now = 0.0
        while True:
            t_arrival = requests[i].at_s if i < count else math.inf
            t_event = events[0][0] if events else math.inf
            now = min(t_arrival, t_event)
            if now == math.inf or now > deadline:
                break
            while next_scrape <= now:
                for sim in self.fleet:
                    sim.scrape(next_scrape)
                next_scrape += interval
            if t_arrival <= t_event:
                request = requests[i]
                i += 1
                flight = self._arrive(request, now)
                if isinstance(flight, Outcome):
                    outcomes[request.index] = flight
                else:
                    flights[request.index] = flight
                continue
            self._horizon = min(next_scrape, t_arrival)
            _, _, item = heapq.heappop(events)
            if isinstance(item, SimBackend):
                for done in self._step_end(item, now):
                    outcomes[done.request.index] = done.outcome
                    flights.pop(done.request.index, None)
            else:
                self._fixed_end(item, now)
                outcomes[item.request.index] = item.outcome
                flights.pop(item.request.index, None)
        for index, flight in flights.items():
            flight.outcome.error = "unfinished at deadline"
            flight.sim.backend.inflight -= 1
            outcomes[index] = flight.outcome
        return ReplayResult(
            outcomes=[o for o in outcomes if o is not None],
            duration_s=now if now != math.inf else last,
            busy_s={s.backend.name: s.busy_s for s in self.fleet},
            steps=self.steps,
            limits=self.limits,
        )

    def _push(self, when: float, item: SimBackend | _Flight) -> None:
        self._seq += 1
        heapq.heappush(self._events, (when, self._seq, item))

    # --- arrivals ------------------------------------------------------------------------------------

    def _arrive(self, request: Recorded, now: float) -> _Flight | Outcome:
        line = request.line
        outcome = Outcome(request.index, line.request_class or "default", now)
        if line.endpoint in EMBEDDINGS:
            self.limits["embeddings"] += 1
            outcome.error = "not modelled: embeddings"
            return outcome
        serving = self._serving.get(line.model)
        if serving is None:
            self.limits[f"model:{line.model}"] += 1
            outcome.error = "not modelled: unknown model"
            return outcome
        estimate = line.prompt_estimate or line.prompt_tokens
        profile = RequestProfile(
            model=line.model,
            prompt_tokens_estimate=estimate,
            context_needed=estimate + (line.max_tokens or 1),
            stream=line.stream,
            key_id=line.key or "anonymous",
            max_tokens=line.max_tokens,
            n=line.n,
            priority=line.priority,
            tenant=line.tenant,
            explicit_class=line.class_header,
            parsed=_AffinityKey(line.affinity) if line.affinity else None,
        )
        decision = self.engine.choose(profile, serving)
        outcome.route = decision.route
        steps = request.output_per_choice
        for backend in decision.candidates:  # the gateway fails over to the next on a refusal
            sim = self._sim_of[backend]
            if not self._fits(sim, line.prompt_tokens, steps, line.n):
                continue
            outcome.backend, outcome.pool, outcome.vendor = backend.name, backend.pool.name, backend.vendor
            backend.inflight += 1
            flight = _Flight(request, sim, outcome, steps, None, decision, profile.prompt_tokens_estimate)
            if sim.scheduler is None:
                flight.ttft_at = now + sim.ttft_s
                self._push(flight.ttft_at + (steps - 1) * sim.tpot_s, flight)
                sim.fixed_open += 1
            else:
                self._submit(sim, flight, now)
            return flight
        decision.answered(profile.prompt_tokens_estimate)  # the gateway ends the request: out of the estimate
        if decision.candidates or decision.rejected_for_context:
            self.limits["context"] += 1
            outcome.error = "not modelled: longer than any backend's context or KV cache"
        else:
            outcome.error = "no backend: " + (decision.why_none or "")
        outcome.status = 400 if decision.candidates or decision.rejected_for_context else 503
        return outcome

    def _fits(self, sim: SimBackend, prompt: int, steps: int, n: int) -> bool:
        if prompt + steps > sim.backend.max_model_len:
            return False
        capacity = sim.kv_capacity_tokens
        return capacity is None or prompt + n * steps <= capacity

    def _submit(self, sim: SimBackend, flight: _Flight, now: float) -> None:
        scheduler = sim.scheduler
        assert scheduler is not None
        line = flight.request.line
        n = max(1, line.n)
        group = Group(
            prompt_tokens=line.prompt_tokens,
            hashes=self._block_hashes(flight.request, scheduler.limits.block_size),
            lengths=[flight.steps] * n,
            reasons=["length" if flight.steps == line.max_tokens else "stop"] * n,
            arrival=now,
        )
        group.waiter = flight
        scheduler.add(group)
        if not sim.stepping:
            self._start_step(sim, now)

    def _block_hashes(self, request: Recorded, block_size: int) -> list[int]:
        """The prompt's KV block names: blocks inside a recorded `prefix` hash are named by it, so prompts
        that shared a document share blocks (half a hash past the last shared one: where in the next hash's
        span the prompts diverged is unknown); the rest are the request's own.

        Tokens per hash come from the request (its tokens over its characters), but every prompt that opens
        with the same first hash uses the first one's figure: the same block then gets the same name in
        each, whatever the length of the rest of the prompt.
        """
        line = request.line
        prompt = line.prompt_tokens
        full = prompt // block_size
        prefix = line.prefix or ()
        chars = 4 * (line.prompt_estimate or prompt)  # the gateway's estimate is characters / 4
        hashes: list[int] = []
        if prefix and chars:
            per_hash = self._tokens_per_hash.setdefault(prefix[0], PREFIX_BLOCK_CHARS * prompt / chars)
            # A prompt sharing hashes 0..k-1 with another and not hash k shares some of block k too: on
            # average half. So the first half of each hash's span is named by the hash before it.
            shared = min(full, int((len(prefix) + 0.5) * per_hash) // block_size)
            for b in range(shared):
                at = ((b + 1) * block_size - 1) / per_hash
                k = int(at)
                hashes.append(hash((prefix[k - 1 if k and at - k < 0.5 else k], b)))
        own = request.index + 1
        hashes.extend(hash((-own, b)) for b in range(len(hashes), full))
        return hashes

    # --- the engine ----------------------------------------------------------------------------------

    def _start_step(self, sim: SimBackend, start: float) -> None:
        scheduler, perf = sim.scheduler, sim.perf
        assert scheduler is not None and perf is not None
        plan = scheduler.plan(start)
        duration = perf.step_seconds(plan.work)
        if duration <= 0:  # nothing can run until something leaves: idle until the next submit
            sim.stepping = False
            return
        sim.stepping = True
        sim.plan = plan
        sim.busy_s += duration
        self.steps += 1
        self._push(start + duration, sim)

    def _step_end(self, sim: SimBackend, end: float) -> list[_Flight]:
        scheduler = sim.scheduler
        assert scheduler is not None
        finished: list[_Flight] = []
        if sim.plan is not None:  # None: the end of coasted steps, already applied
            for group in scheduler.apply(sim.plan, end):
                flight: _Flight = group.waiter
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
        """Apply the decode-only steps that start before the next arrival or scrape and finish no request;
        returns when the next step starts. Only when nothing waits and no new KV block would be missing."""
        scheduler, perf = sim.scheduler, sim.perf
        assert scheduler is not None and perf is not None
        horizon = self._horizon
        running = scheduler.running
        if scheduler.waiting or not running or start >= horizon:
            return start
        room = min(g.steps - g.generated for g in running) - 1  # the finishing step runs on its own
        if room < 2 or any(g.computed < g.target for g in running):
            return start
        seqs = sum(g.n for g in running)
        context = sum(g.n * (g.prompt_tokens + g.generated) for g in running)
        steps, t = 0, start
        step_seconds = perf.step_seconds
        while steps < room and t < horizon:
            t += step_seconds(StepWork(decode_seqs=seqs, decode_context=context))
            context += seqs
            steps += 1
        pool = scheduler.pool
        grow = [
            pool.blocks_for(g.prompt_tokens + g.n * (g.generated + steps)) - g.holding.blocks for g in running
        ]
        if steps < 2 or sum(grow) > pool.free:
            return start
        for group, blocks in zip(running, grow, strict=True):
            if blocks > 0:
                pool.grow(group.holding, blocks)
            group.generated += steps
            group.last_token_at = t
        sim.stats.generation_tokens += seqs * steps
        sim.stats.kv_tokens = pool.used * scheduler.limits.block_size
        sim.busy_s += t - start
        self.steps += steps
        return t

    # --- the end of a request ------------------------------------------------------------------------

    def _fixed_end(self, flight: _Flight, end: float) -> None:
        flight.sim.fixed_open -= 1
        self._finish(flight, end)

    def _finish(self, flight: _Flight, end: float) -> None:
        """What the gateway's `account` and `observe` see, and what the load-test client measures."""
        outcome = flight.outcome
        line = flight.request.line
        backend = flight.sim.backend
        backend.inflight -= 1
        flight.answered()  # a whole answer (or a stream on a fixed-latency backend): no-op if told already
        n = max(1, line.n)
        tokens = flight.steps * n
        outcome.status = 200
        outcome.prompt_tokens = line.prompt_tokens
        outcome.completion_tokens = tokens
        outcome.e2e = end - outcome.sent_at
        ttft = outcome.ttft = (flight.ttft_at if flight.ttft_at is not None else end) - outcome.sent_at
        if flight.steps > 1:
            outcome.tpot = (outcome.e2e - ttft) / (flight.steps - 1)
        seen = self._observed_per_simulated  # gateway/request/pipeline.py observe(), on the gateway's clock
        per_choice = flight.steps  # observe() times one choice's tokens: the n choices decode side by side
        if line.stream:
            tpot = (outcome.e2e - ttft) / (per_choice - 1) * seen if per_choice > 1 else None
            backend.observed.add(ttft * seen, tpot)
        elif per_choice >= 16:
            backend.observed.add(None, outcome.e2e / per_choice * seen)
