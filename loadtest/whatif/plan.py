"""`switchyard plan`: the cheapest fleet mix that meets every class's SLO on recorded traffic.

A mix is how many backends of each GPU type serve the log's model; each backend runs the model on the
fewest GPUs (tensor parallel) whose memory holds its weights and the log's longest request. A mix passes
when, under at least one of the policies tried (the presets and the candidate), every class with an SLO
meets it for at least `target` of its requests, on the recorded load and on `scale` times it.

The search (each step a virtual-clock replay, loadtest/whatif/replay.py):
- each GPU type alone: the fewest backends that pass (doubling, then bisection);
- every count of the other types up to their solo figure, with the last type bisected inside the budget
  the cheapest passing mix so far leaves (a mix dearer than it is never replayed: it is dominated);
- more backends never serve worse, so a count that fails bounds the bisection from below.
Every mix replayed is kept; the frontier is the mixes no cheaper one beats on the worst class.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from backends.accelerators import CATALOGUE, Accelerator, Vendor, find
from backends.sim.fleet_spec import FleetSpec, GroupSpec, ProfileSpec
from backends.sim.profiles import ProfileError, build_hardware
from loadtest.scenario import Slo
from loadtest.whatif.accesslog import Trace
from loadtest.whatif.compare import replay_policy, whatif_scenario

DEFAULT_TYPES = ("h100", "mi300x")
DEFAULT_PRICES = {name: CATALOGUE[name].price_per_gpu_hour for name in DEFAULT_TYPES}
"""The GPU types a plan weighs when `--gpu` names none, at the catalogue's prices."""
MAX_BACKENDS = 64
TP_CHOICES = (1, 2, 4, 8)


class PlanError(ValueError):
    """A plan that cannot be made (the message says why)."""


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    """As the operator calls it (`--gpu h100=2.90`): the pool and accelerator name."""
    accelerator: Accelerator
    price_per_gpu_hour: float
    gpus_per_backend: int
    max_model_len: int

    @property
    def profile(self) -> str:
        return self.accelerator.profile

    @property
    def vendor(self) -> Vendor:
        return self.accelerator.vendor

    @property
    def backend_per_hour(self) -> float:
        return self.price_per_gpu_hour * self.gpus_per_backend


@dataclass(slots=True)
class Verdict:
    """How a mix served the log: the best policy's worst class attainment, at every load tried."""

    counts: tuple[int, ...]
    usd_per_hour: float
    policy: str | None
    worst: float
    """The lowest class SLO attainment of the best policy, over the loads tried (1.0 if no SLO)."""
    passed: bool
    by_policy: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class Plan:
    types: list[GpuType]
    model: str
    target: float
    scales: list[float]
    verdicts: list[Verdict]
    best: Verdict | None
    replays: int
    policies: dict[str, Path] = field(default_factory=dict)

    @property
    def frontier(self) -> list[Verdict]:
        """Cheapest first; each one serves its worst class better than every cheaper mix."""
        out: list[Verdict] = []
        for verdict in sorted(self.verdicts, key=lambda v: (v.usd_per_hour, -v.worst)):
            if not out or verdict.worst > out[-1].worst:
                out.append(verdict)
        return out


def gpu_type(name: str, price: float, model: str, context: int) -> GpuType:
    """The GPU type with the fewest GPUs per backend that hold `model` and a `context`-token request."""
    accelerator = find(name)
    if accelerator is None:
        raise PlanError(f"--gpu {name}: unknown GPU; known: {', '.join(sorted(CATALOGUE))}")
    if price <= 0:
        raise PlanError(f"--gpu {name}: the price per GPU-hour must be positive")
    for gpus in TP_CHOICES:
        try:
            hardware = build_hardware(accelerator.profile, model, gpus)
        except ProfileError as exc:
            if "unknown" in str(exc):
                raise PlanError(str(exc)) from None
            continue
        if hardware.kv_capacity_tokens >= context:
            max_len = min(hardware.kv_capacity_tokens, max(8192, context))
            return GpuType(name.lower(), accelerator, price, gpus, max_len)
    raise PlanError(f"{model} does not fit on {max(TP_CHOICES)}x {name} with a {context}-token request")


def fleet_of(types: Sequence[GpuType], counts: Sequence[int], model: str) -> FleetSpec:
    groups = [
        GroupSpec(
            pool=t.name,
            vendor=t.vendor,
            accelerator=t.name,
            count=count,
            gpus_per_backend=t.gpus_per_backend,
            price_per_gpu_hour=t.price_per_gpu_hour,
            max_model_len=t.max_model_len,
            profile=ProfileSpec(gpu=t.profile, model=model),
            labels={"tier": t.accelerator.tier},
        )
        for t, count in zip(types, counts, strict=True)
        if count > 0
    ]
    return FleetSpec(model=model, groups=groups, max_model_len=min(t.max_model_len for t in types))


class Planner:
    def __init__(
        self,
        traces: Sequence[Trace],
        types: Sequence[GpuType],
        model: str,
        policies: Sequence[tuple[str, Path]],
        slos: dict[str, Slo],
        target: float,
        scrape_interval_s: float = 1.0,
    ) -> None:
        self.traces = list(traces)  # the hardest (the largest scale) first: most mixes fail there
        self.types = list(types)
        self.model = model
        self.policies = list(policies)
        self.slos = {name: slo for name, slo in slos.items() if slo.ttft_ms or slo.tpot_ms or slo.e2e_ms}
        self.target = target
        self.scrape_interval_s = scrape_interval_s
        self.cache: dict[tuple[int, ...], Verdict] = {}
        self.replays = 0
        self._first: list[str] = []

    def cost(self, counts: Sequence[int]) -> float:
        return sum(t.backend_per_hour * c for t, c in zip(self.types, counts, strict=True))

    def worst_class(self, trace: Trace, counts: tuple[int, ...], name: str, path: Path) -> float:
        fleet = fleet_of(self.types, counts, self.model)
        scenario = whatif_scenario(trace, fleet, self.slos)
        report = replay_policy(name, path, scenario, trace, self.scrape_interval_s).report
        self.replays += 1
        met = [report["classes"][c]["slo_attainment"] or 0.0 for c in report["classes"] if c in self.slos]
        return min(met, default=1.0)

    def judge(self, counts: tuple[int, ...], every_policy: bool = False) -> Verdict:
        """Replay the mix; stops at the first policy that passes unless `every_policy`."""
        cached = self.cache.get(counts)
        if cached is not None and (not every_policy or len(cached.by_policy) == len(self.policies)):
            return cached
        by_policy = dict(cached.by_policy) if cached else {}
        order = sorted(self.policies, key=lambda p: self._first.index(p[0]) if p[0] in self._first else 99)
        for name, path in order:
            if name in by_policy:
                continue
            worst = 1.0
            for trace in self.traces:
                worst = min(worst, self.worst_class(trace, counts, name, path))
                if worst < self.target and not every_policy:
                    break
            by_policy[name] = worst
            if worst >= self.target and not every_policy:
                break
        policy = max(by_policy, key=lambda p: by_policy[p])
        best = by_policy[policy]
        if best >= self.target and policy in self._first:
            self._first.remove(policy)
        if best >= self.target:
            self._first.insert(0, policy)
        verdict = Verdict(counts, self.cost(counts), policy, best, best >= self.target, by_policy)
        self.cache[counts] = verdict
        return verdict

    def fewest(self, counts: list[int], slot: int, low: int, high: int) -> int | None:
        """The fewest backends of type `slot` in (low, high] for which the mix passes, or None."""
        if high <= low:
            return None
        counts[slot] = high
        if not sum(counts) or not self.judge(tuple(counts)).passed:
            return None
        while high - low > 1:
            middle = (low + high) // 2
            counts[slot] = middle
            if sum(counts) and self.judge(tuple(counts)).passed:
                high = middle
            else:
                low = middle
        counts[slot] = high
        return high

    def solo(self, slot: int) -> int | None:
        counts = [0] * len(self.types)
        low, high = 0, 1
        while high <= MAX_BACKENDS:
            counts[slot] = high
            if self.judge(tuple(counts)).passed:
                return self.fewest(counts, slot, low, high)
            low, high = high, high * 2
        return None

    def search(self) -> Plan:
        solos = [self.solo(i) for i in range(len(self.types))]
        last = len(self.types) - 1
        passing = [v for v in self.cache.values() if v.passed]
        budget = min((v.usd_per_hour for v in passing), default=float("inf"))
        bounds = [(s if s is not None else MAX_BACKENDS) for s in solos[:last]]
        unit = self.types[last].backend_per_hour
        cap = solos[last] if solos[last] is not None else MAX_BACKENDS
        for head in itertools.product(*(range(0, b + 1) for b in bounds)):
            base = self.cost([*head, 0])
            if not any(head) or base >= budget:  # the last type alone was searched; dearer mixes lose
                continue
            room = cap if budget == float("inf") else min(cap, int((budget - base) / unit - 1e-9))
            counts = [*head, 0]
            if self.fewest(counts, last, -1, room) is not None:
                budget = min(budget, self.cost(counts))
        passing = [v for v in self.cache.values() if v.passed]
        best = min(passing, key=lambda v: (v.usd_per_hour, -v.worst), default=None)
        if best is not None:
            best = self.judge(best.counts, every_policy=True)
        verdicts = list(self.cache.values())
        policies = dict(self.policies)
        return Plan(self.types, self.model, self.target, [], verdicts, best, self.replays, policies)
