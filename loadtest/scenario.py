"""The scenario file: which traffic to send, what each class of it must meet, and the fleet to send it to.

    name: mixed
    seed: 7
    duration_s: 240           # simulated seconds of arrivals (the fleet's clock; real time = / time_scale)
    time_scale: 4             # simulated seconds per real second, for every backend of the fleet
    max_requests: 2000        # hard bound on requests sent
    max_inflight: 400         # arrivals beyond this many open requests are dropped (counted as errors)
    drain_s: 60               # after the last arrival, wait at most this long for answers
    arrivals: {process: poisson, rate: 6}          # or {process: ramp, rate: 2, to_rate: 10}
                                                    # or {process: trace, file: traces/x.jsonl}
    fleet: {file: ../../backends/sim/fleets/demo.yaml}   # or the fleet inline: {model, groups, ...}
    model: llama-3.1-8b       # default: the fleet's
    classes:
      - name: chat
        weight: 6             # share of arrivals
        prompt_tokens: {mean: 400, spread: 0.6, min: 20, max: 1800}   # log-normal; spread 0 = fixed
        output_tokens: {mean: 200, spread: 0.5, min: 8, max: 900}
        n: 1
        priority: {value: high, fraction: 0.2}      # `x-switchyard-priority` on a share of requests
        shared_prefix: {documents: 8, tokens: 5000} # prompts start with one of N shared documents
        slo: {ttft_ms: 1000, tpot_ms: 60, e2e_ms: 30000}

Times in the file are simulated; the runner divides them by `time_scale` to schedule in real time and
multiplies what it measures back, so reports read in the fleet's own seconds. Validated once, with the
file and line of each mistake (backends.yamlfile).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import msgspec

from backends.sim.fleet_spec import FleetSpec, load_fleet_spec, parse_fleet_spec
from backends.yamlfile import ConfigError, decode, parse_yaml, read_text

SCENARIOS_DIR = Path(__file__).parent / "scenarios"

_Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=48)]
_Positive = Annotated[float, msgspec.Meta(gt=0)]
_Count = Annotated[int, msgspec.Meta(ge=1)]


class Lengths(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Token counts drawn log-normally around `mean` (sigma `spread`), clipped to [min, max]."""

    mean: _Positive
    spread: Annotated[float, msgspec.Meta(ge=0, le=3)] = 0.0
    min: _Count = 1
    max: _Count = 1_000_000


class Priority(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    value: Annotated[str, msgspec.Meta(min_length=1, max_length=32)]
    fraction: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0


class SharedPrefix(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Prompts open with one of `documents` shared texts of `tokens` tokens (RAG over a small corpus),
    so prefix caching and prefix affinity pay off."""

    documents: _Count
    tokens: _Count


class Slo(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    ttft_ms: _Positive | None = None
    tpot_ms: _Positive | None = None
    e2e_ms: _Positive | None = None


class RequestClass(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: _Name
    weight: _Positive = 1.0
    prompt_tokens: Lengths
    output_tokens: Lengths
    n: Annotated[int, msgspec.Meta(ge=1, le=16)] | list[Annotated[int, msgspec.Meta(ge=1, le=16)]] = 1
    """Choices per request; a list draws one of its values per request (`[1, 4]`)."""
    stream: bool = True
    """Streamed (chat) or one JSON answer (batch jobs); TTFT of a JSON answer is its whole time."""
    priority: Priority | None = None
    shared_prefix: SharedPrefix | None = None
    slo: Slo = msgspec.field(default_factory=Slo)


class BatchJob(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A Batch API job submitted at the start of the run (`/v1/files` + `/v1/batches`), run by the
    gateway in the fleet's idle room; its tokens count in the fleet's cost per million tokens."""

    lines: Annotated[int, msgspec.Meta(ge=0, le=100_000)]
    prompt_tokens: Lengths
    output_tokens: Lengths


class Poisson(msgspec.Struct, tag="poisson", tag_field="process", forbid_unknown_fields=True):
    rate: _Positive
    """Requests per simulated second."""


class Ramp(msgspec.Struct, tag="ramp", tag_field="process", forbid_unknown_fields=True):
    """A Poisson process whose rate moves linearly from `rate` to `to_rate` over the run."""

    rate: Annotated[float, msgspec.Meta(ge=0)]
    to_rate: Annotated[float, msgspec.Meta(ge=0)]


class Trace(msgspec.Struct, tag="trace", tag_field="process", forbid_unknown_fields=True):
    """Replay a JSONL trace (loadtest/arrivals.py); relative to the scenario file."""

    file: Annotated[str, msgspec.Meta(min_length=1)]


class Bursts(msgspec.Struct, tag="bursts", tag_field="process", forbid_unknown_fields=True):
    """A Poisson process at `rate`, rising to `burst_rate` for `burst_s` at the start of every `every_s`."""

    rate: _Positive
    burst_rate: _Positive
    every_s: _Positive = 30.0
    burst_s: _Positive = 5.0


Arrivals = Poisson | Ramp | Trace | Bursts


class ScenarioFile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    name: _Name
    description: str | None = None
    seed: int = 1
    duration_s: _Positive
    time_scale: _Positive | None = None
    """Overrides the fleet's time_scale."""
    max_requests: Annotated[int, msgspec.Meta(ge=1, le=100_000)] = 5000
    max_inflight: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 512
    drain_s: _Positive = 60.0
    arrivals: Arrivals
    fleet: dict[str, Any]
    """`{file: path}` (relative to this file), or a fleet inline (backends/sim/fleet_spec.py)."""
    model: str | None = None
    classes: Annotated[list[RequestClass], msgspec.Meta(min_length=1)]
    batch: BatchJob | None = None
    """Off unless given (and `--batch-lines 0` turns it off)."""


class Scenario(msgspec.Struct, kw_only=True):
    """A validated scenario with its fleet resolved."""

    source: Path
    spec: ScenarioFile
    fleet: FleetSpec
    time_scale: float
    model: str

    @property
    def name(self) -> str:
        return self.spec.name

    def path(self, relative: str) -> Path:
        """A path named in the file, relative to the file."""
        target = Path(relative)
        return target if target.is_absolute() else self.source.parent / target

    def class_named(self, name: str) -> RequestClass:
        for cls in self.spec.classes:
            if cls.name == name:
                return cls
        raise KeyError(name)


def resolve_scenario(name_or_path: str) -> Path:
    """A shipped scenario's file for a bare name (`mixed`), else the path as given."""
    if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        return SCENARIOS_DIR / f"{name_or_path}.yaml"
    return Path(name_or_path)


def parse_scenario(text: str, source: Path) -> Scenario:
    where = str(source)
    data, lines = parse_yaml(text, where)
    if not isinstance(data, dict):
        raise ConfigError(
            where, 1, "a scenario must be a mapping with `name`, `arrivals`, `fleet`, `classes`"
        )
    spec = decode(data, lines, ScenarioFile, where)
    seen: set[str] = set()
    for i, cls in enumerate(spec.classes):
        if cls.name in seen:
            raise ConfigError(
                where, lines.get(("classes", i, "name")), f"class `{cls.name}` is defined twice"
            )
        seen.add(cls.name)
        for field in ("prompt_tokens", "output_tokens"):
            lengths: Lengths = getattr(cls, field)
            if lengths.min > lengths.max:
                raise ConfigError(where, lines.get(("classes", i, field)), "`min` is larger than `max`")
    if set(spec.fleet) == {"file"}:
        fleet_path = Path(str(spec.fleet["file"]))
        if not fleet_path.is_absolute():
            fleet_path = source.parent / fleet_path
        fleet = load_fleet_spec(fleet_path)
    else:
        fleet = parse_fleet_spec(msgspec.json.encode(spec.fleet).decode(), f"{where} (fleet)")
    time_scale = spec.time_scale or fleet.time_scale
    fleet = msgspec.structs.replace(fleet, time_scale=time_scale)
    if isinstance(spec.arrivals, Trace):
        trace = Path(spec.arrivals.file)
        if not (trace if trace.is_absolute() else source.parent / trace).is_file():
            raise ConfigError(where, lines.get(("arrivals", "file")), f"trace file `{trace}` not found")
    return Scenario(
        source=source, spec=spec, fleet=fleet, time_scale=time_scale, model=spec.model or fleet.model
    )


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Read and validate a scenario by shipped name or path; raises ConfigError naming file and line."""
    path = resolve_scenario(str(name_or_path))
    return parse_scenario(read_text(path, "scenario file"), path)


def with_overrides(
    scenario: Scenario,
    *,
    duration_s: float | None = None,
    rate: float | None = None,
    seed: int | None = None,
    time_scale: float | None = None,
    max_requests: int | None = None,
    batch_lines: int | None = None,
    fleet: FleetSpec | None = None,
) -> Scenario:
    """The scenario with command-line overrides applied (`rate` scales a ramp or bursts, keeping the
    shape; `fleet` replaces the scenario's fleet)."""
    spec = scenario.spec
    changes: dict[str, Any] = {}
    if duration_s is not None:
        changes["duration_s"] = duration_s
    if seed is not None:
        changes["seed"] = seed
    if max_requests is not None:
        changes["max_requests"] = max_requests
    if batch_lines is not None and spec.batch is not None:
        changes["batch"] = msgspec.structs.replace(spec.batch, lines=batch_lines) if batch_lines else None
    arrivals: Arrivals = spec.arrivals
    if rate is not None and isinstance(arrivals, Poisson):
        changes["arrivals"] = Poisson(rate=rate)
    elif rate is not None and isinstance(arrivals, Ramp):
        factor = rate / arrivals.rate if arrivals.rate > 0 else 1.0
        changes["arrivals"] = Ramp(rate=rate, to_rate=arrivals.to_rate * factor)
    elif rate is not None and isinstance(arrivals, Bursts):
        factor = rate / arrivals.rate
        changes["arrivals"] = msgspec.structs.replace(
            arrivals, rate=rate, burst_rate=arrivals.burst_rate * factor
        )
    new_spec = msgspec.structs.replace(spec, **changes)
    scale = time_scale or scenario.time_scale
    base_fleet = fleet if fleet is not None else scenario.fleet
    model = scenario.model if fleet is None or spec.model is not None else fleet.model
    return msgspec.structs.replace(
        scenario,
        spec=new_spec,
        time_scale=scale,
        model=model,
        fleet=msgspec.structs.replace(base_fleet, time_scale=scale),
    )


FLEETS_DIR = Path(__file__).parent / "fleets"
DEMO_FLEET = Path(__file__).parent.parent / "backends" / "sim" / "fleets" / "demo.yaml"


def load_fleet(name_or_path: str) -> FleetSpec:
    """`demo` (backends/sim/fleets/demo.yaml), a fleet of loadtest/fleets/ by name, or a path."""
    if name_or_path == "demo":
        return load_fleet_spec(DEMO_FLEET)
    if "/" not in name_or_path and not name_or_path.endswith((".yaml", ".yml")):
        return load_fleet_spec(FLEETS_DIR / f"{name_or_path}.yaml")
    return load_fleet_spec(Path(name_or_path))
