"""The requests of a run: arrival times and bodies, all drawn from the scenario and its seed.

The plan is made once, before any policy runs, so every policy is sent the very same requests at the
very same (simulated) times. Prompts are words of the simulator's vocabulary, one token each to the
simulator; a class with `shared_prefix` opens its prompts with one of a few shared documents.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import msgspec

from backends.sim.text import VOCABULARY
from loadtest.arrivals import TraceEntry, burst_times, load_trace, poisson_times, ramp_times
from loadtest.scenario import Bursts, Lengths, Poisson, Ramp, RequestClass, Scenario


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    index: int
    at_s: float
    """Simulated seconds after the start of the run."""
    request_class: str
    prompt_tokens: int
    output_tokens: int
    n: int
    body: bytes
    stream: bool = True
    headers: dict[str, str] = field(default_factory=dict)


def draw_length(lengths: Lengths, rng: random.Random) -> int:
    """A log-normal draw with median-corrected mean `lengths.mean`, clipped to [min, max]."""
    if lengths.spread <= 0:
        value = lengths.mean
    else:
        mu = math.log(lengths.mean) - lengths.spread**2 / 2
        value = rng.lognormvariate(mu, lengths.spread)
    return int(min(lengths.max, max(lengths.min, round(value))))


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(VOCABULARY) for _ in range(count))


class _Documents:
    """Shared documents by (class, index), made once per plan."""

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._cache: dict[tuple[str, int, int], str] = {}

    def get(self, cls: str, index: int, tokens: int) -> str:
        key = (cls, index, tokens)
        text = self._cache.get(key)
        if text is None:
            rng = random.Random(f"{self._seed}/{cls}/doc/{index}")
            text = self._cache[key] = f"Document {index}: " + _words(rng, tokens)
        return text


def arrival_entries(scenario: Scenario, rng: random.Random) -> list[TraceEntry]:
    """One entry per arrival (only `t` set for generated processes), bounded by duration and count."""
    spec = scenario.spec
    arrivals = spec.arrivals
    if isinstance(arrivals, Poisson):
        times = poisson_times(arrivals.rate, spec.duration_s, rng, spec.max_requests)
    elif isinstance(arrivals, Ramp):
        times = ramp_times(arrivals.rate, arrivals.to_rate, spec.duration_s, rng, spec.max_requests)
    elif isinstance(arrivals, Bursts):
        a = arrivals
        times = burst_times(
            a.rate, a.burst_rate, a.every_s, a.burst_s, spec.duration_s, rng, spec.max_requests
        )
    else:
        return load_trace(scenario.path(arrivals.file), spec.duration_s, spec.max_requests)
    return [TraceEntry(t=t) for t in times]


def plan(scenario: Scenario) -> list[PlannedRequest]:
    """Every request of the run, in arrival order; the same scenario and seed give the same plan."""
    rng = random.Random(scenario.spec.seed)
    classes = scenario.spec.classes
    weights = [c.weight for c in classes]
    by_name = {c.name: c for c in classes}
    documents = _Documents(scenario.spec.seed)
    planned: list[PlannedRequest] = []
    for index, entry in enumerate(arrival_entries(scenario, rng)):
        cls = by_name.get(entry.cls) if entry.cls else None
        if cls is None:
            cls = rng.choices(classes, weights)[0]
        planned.append(_request(scenario, cls, entry, index, rng, documents))
    return planned


def _request(
    scenario: Scenario,
    cls: RequestClass,
    entry: TraceEntry,
    index: int,
    rng: random.Random,
    documents: _Documents,
) -> PlannedRequest:
    prompt_tokens = entry.prompt_tokens or draw_length(cls.prompt_tokens, rng)
    output_tokens = entry.output_tokens or draw_length(cls.output_tokens, rng)
    n = entry.n or (cls.n if isinstance(cls.n, int) else rng.choice(cls.n))
    messages: list[dict[str, str]] = []
    question_tokens = prompt_tokens
    if cls.shared_prefix is not None:
        doc = entry.document if entry.document is not None else rng.randrange(cls.shared_prefix.documents)
        messages.append({"role": "system", "content": documents.get(cls.name, doc, cls.shared_prefix.tokens)})
        question_tokens = max(1, prompt_tokens - cls.shared_prefix.tokens)
    messages.append({"role": "user", "content": f"Request {index}: " + _words(rng, question_tokens)})
    body = {
        "model": scenario.model,
        "messages": messages,
        "max_tokens": output_tokens,
        "n": n,
        "stream": cls.stream,
        "temperature": 0.7,
        "seed": index,
    }
    if cls.stream:
        body["stream_options"] = {"include_usage": True}
    headers: dict[str, str] = {"x-request-id": f"loadtest-{scenario.spec.seed}-{index}"}
    priority = entry.priority
    if priority is None and cls.priority is not None and rng.random() < cls.priority.fraction:
        priority = cls.priority.value
    if priority is not None:
        headers["x-switchyard-priority"] = priority
    return PlannedRequest(
        index=index,
        at_s=entry.t,
        request_class=cls.name,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        n=n,
        body=msgspec.json.encode(body),
        headers=headers,
        stream=cls.stream,
    )
