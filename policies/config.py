"""The policy file an operator writes: classes of requests, and a route for each class.

    name: balanced
    classes:                       # first match wins; `default` matches everything else
      - name: interactive
        when: {priority: high}
      - name: long-context
        when: {prompt_tokens: {gt: 8000}}
    routes:
      interactive:
        prefer: {vendor: nvidia}   # pools tried first
        fallback: {vendor: amd}    # pools to spill to
        slo: {ttft_ms: 500, tpot_ms: 50}
        strategy: {slo-predicted: 2, least-outstanding: 1}
      default:
        prefer: any
        strategy: {cheapest: 1}

Validated once at load: structure by msgspec, references (routes for every class, known plugins) here,
each error with the file and line to fix. See policies/presets/ for complete, commented examples.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import msgspec

from backends.accelerators import Vendor
from backends.yamlfile import ConfigError, decode, parse_yaml, read_text
from policies.profile import DEFAULT_CLASS

_Name = Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9_-]*$", max_length=64)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Threshold(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A numeric test; every bound given must hold (`{gt: 8000}`, `{gte: 2, lte: 8}`)."""

    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None
    eq: float | None = None


class Condition(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """What a request must look like to be in a class; every field given must match (AND).

    `any` holds alternatives (OR). Strings accept a single value or a list of values.
    """

    model: str | list[str] | None = None
    prompt_tokens: Threshold | None = None
    max_tokens: Threshold | None = None
    n: Threshold | None = None
    stream: bool | None = None
    priority: str | list[str] | None = None
    key: str | list[str] | None = None
    tenant: str | list[str] | None = None
    headers: dict[str, str] | None = None
    any: list[Condition] | None = None


class ClassRule(msgspec.Struct, forbid_unknown_fields=True):
    name: _Name
    when: Condition | None = None
    description: str | None = None


class PoolSelector(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Pools by vendor, accelerator, name or labels; every field given must match."""

    vendor: Vendor | None = None
    accelerator: str | list[str] | None = None
    pool: str | list[str] | None = None
    labels: dict[str, str] | None = None


Selection = Literal["any", "none"] | PoolSelector | list[PoolSelector]


class Slo(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    ttft_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    tpot_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None


class Saturation(msgspec.Struct, forbid_unknown_fields=True):
    """Beyond these, a backend counts as unable to take more work: it is tried only after the others."""

    max_waiting: _NonNegative = 4
    max_kv_cache_usage: Annotated[float, msgspec.Meta(ge=0, le=1)] = 0.95
    max_inflight: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Requests this gateway has in flight on the backend."""
    max_seqs: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """Sequences this gateway has in flight on the backend (a request with `n` choices holds n): vLLM
    decodes at most `max_num_seqs` (1,024 by default on H100 and MI300X) at once, each sequence slows
    every step, and one held by a long job is not free for a burst of interactive work until the job ends."""
    max_tpot_ms: Annotated[float, msgspec.Meta(gt=0)] | None = None
    """The backend's measured time per output token (this gateway's recent requests) past which it takes
    no more of this class. Long prompts' prefills slow every decode step beside them, and slow steps keep
    more sequences in flight, which slow the steps further: holding new ones while decoding is slow stops
    that loop before the SLO is missed, where a limit at the SLO itself reacts too late (the measurement
    lags by a request's length)."""
    max_slowdown: Annotated[float, msgspec.Meta(gt=1)] | None = None
    """The same mark relative to the backend: its measured time per output token past this many times
    its model's time at light load on its accelerators (backends/model_size.py; no mark where either is
    unknown). A step at light load reads the weights once; what it takes beyond that is KV reads and
    prefills, which grow with every sequence taken in. A small model on a large GPU reaches 6x its light
    load (the loop above) long before its SLO; a 70B one's KV cache is too small beside its weights to
    reach 2x, so one ratio serves both where one number of milliseconds cannot."""


_Seconds = Annotated[float, msgspec.Meta(gt=0)]


class RouteTimeouts(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Seconds; each one given overrides the gateway's `gateway.timeouts` for this class."""

    connect: _Seconds | None = None
    first_byte: _Seconds | None = None
    """To the whole answer (JSON) or the first token (stream); a backend that misses it is left for the
    next candidate."""
    between_chunks: _Seconds | None = None
    total: _Seconds | None = None


class Backpressure(msgspec.Struct, forbid_unknown_fields=True):
    """When every candidate is saturated (see `saturation`), queue briefly, then answer 429."""

    max_queued: Annotated[int, msgspec.Meta(ge=0)] = 32
    """Requests of this class waiting at once; more are refused at once."""
    max_wait_ms: Annotated[float, msgspec.Meta(ge=0)] = 1000.0
    retry_after_s: Annotated[int, msgspec.Meta(ge=1)] = 1
    """The `Retry-After` sent with the 429."""


class Route(msgspec.Struct, forbid_unknown_fields=True):
    prefer: Selection = "any"
    fallback: Selection = "none"
    slo: Slo | None = None
    saturation: Saturation = msgspec.field(default_factory=Saturation)
    strategy: dict[str, Annotated[float, msgspec.Meta(gt=0)]] = msgspec.field(
        default_factory=lambda: {"least-outstanding": 1.0}
    )
    filters: list[str] = []
    picker: str = "best-score"
    timeouts: RouteTimeouts | None = None
    backpressure: Backpressure | None = None
    """Off unless given: requests are then sent even to saturated backends (tried last)."""
    shed: bool = False
    """Under overload this class may be held briefly and then refused (429 with `Retry-After`), so the
    classes that are not shed keep their SLO: a request of it is admitted only while some candidate can
    take more work (not saturated by the predicted queue, not predicted to miss this route's SLO).
    Tighter `saturation` limits shed a class earlier. Implies `backpressure` (SHED_BACKPRESSURE unless
    given)."""


SHED_BACKPRESSURE = Backpressure(max_queued=64, max_wait_ms=500.0, retry_after_s=2)


class PluginSpec(msgspec.Struct, forbid_unknown_fields=True):
    """A configured plugin instance: a registered `type` with parameters, referred to by `name`."""

    type: str
    name: str | None = None
    params: dict[str, Any] = {}


class PolicyFile(msgspec.Struct, forbid_unknown_fields=True):
    routes: dict[str, Route]
    name: str = "unnamed"
    description: str | None = None
    classes: list[ClassRule] = []
    plugins: list[PluginSpec] = []
    imports: list[str] = []
    headers: dict[Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")], dict[str, str]] = {}
    """Request headers that name a class, checked before the class rules: header name (any case) ->
    value -> class. A value matches the header's first comma-separated item, case-insensitively, so
    RFC 9218 `priority: u=6, i` matches `u=6`."""


class LoadedPolicy(msgspec.Struct):
    """A validated policy file plus where it came from, for errors found later (against the fleet)."""

    source: str
    policy: PolicyFile
    lines: dict[tuple[Any, ...], int]
    version: str = ""
    """The start of the text's SHA-256: the same file gives the same version (reload skips it)."""

    def line(self, *path: Any) -> int | None:
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.lines.get(())


def _check_references(loaded: LoadedPolicy) -> None:
    policy, source = loaded.policy, loaded.source
    seen: set[str] = set()
    for i, rule in enumerate(policy.classes):
        if rule.name in seen:
            raise ConfigError(
                source, loaded.line("classes", i, "name"), f"class `{rule.name}` is defined twice"
            )
        if rule.name == DEFAULT_CLASS:
            raise ConfigError(
                source,
                loaded.line("classes", i, "name"),
                "`default` is the class of requests no rule matches; it takes no rule",
                hint="give this class another name, or delete the rule",
            )
        seen.add(rule.name)
        if rule.when is None:
            raise ConfigError(
                source,
                loaded.line("classes", i),
                f"class `{rule.name}` has no `when`",
                hint="add `when: {...}`",
            )
        if rule.name not in policy.routes:
            raise ConfigError(
                source,
                loaded.line("classes", i, "name"),
                f"class `{rule.name}` has no route",
                hint=f"add `{rule.name}:` under `routes:`",
            )
    if DEFAULT_CLASS not in policy.routes:
        raise ConfigError(
            source,
            loaded.line("routes"),
            "`routes` has no `default`",
            hint="add a `default:` route for the rest",
        )
    for header, values in policy.headers.items():
        for value, cls in values.items():
            if cls not in policy.routes:
                raise ConfigError(
                    source,
                    loaded.line("headers", header, value),
                    f"header `{header}: {value}` names class `{cls}`, which has no route",
                    hint=f"one of: {', '.join(policy.routes)}",
                )
    if policy.routes and all(route.shed for route in policy.routes.values()):
        last = list(policy.routes)[-1]
        raise ConfigError(
            source,
            loaded.line("routes", last, "shed"),
            "every route has `shed: true`: under overload nothing would be protected",
            hint="keep at least one class (the interactive one) unshed",
        )
    for name in policy.routes:
        if name != DEFAULT_CLASS and name not in seen:
            raise ConfigError(
                source,
                loaded.line("routes", name),
                f"route `{name}` is for a class that is not defined",
                hint=f"add a class named `{name}` under `classes:`, or fix the spelling",
            )


_ENUM_AT_RE = re.compile(r"^Invalid enum value .* \(at ([^)]*)\)$")
_PART_RE = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _enum_values(info: msgspec.inspect.Type, path: str) -> list[str]:
    """The values a Literal at `path` (as a ConfigError names it: `routes.x.prefer[0].vendor`) allows."""
    found: list[str] = []
    todo = [info]
    for name, index in _PART_RE.findall(path):
        step: list[msgspec.inspect.Type] = []
        for t in todo:
            members = t.types if isinstance(t, msgspec.inspect.UnionType) else (t,)
            for m in members:
                if isinstance(m, msgspec.inspect.StructType) and name:
                    step += [f.type for f in m.fields if f.encode_name == name]
                elif isinstance(m, msgspec.inspect.DictType) and name:
                    step.append(m.value_type)
                elif isinstance(m, msgspec.inspect.ListType) and index:
                    step.append(m.item_type)
        todo = step
    for t in todo:
        for m in t.types if isinstance(t, msgspec.inspect.UnionType) else (t,):
            if isinstance(m, msgspec.inspect.LiteralType):
                found += [str(v) for v in m.values]
    return found


def _decode(data: Any, lines: dict[tuple[Any, ...], int], schema: type[Any], source: str, **kw: Any) -> Any:
    """`decode`, naming the allowed values when a value is not one of them (`vendor: AMD`)."""
    try:
        return decode(data, lines, schema, source, **kw)
    except ConfigError as exc:
        match = _ENUM_AT_RE.match(exc.reason)
        values = _enum_values(msgspec.inspect.type_info(PolicyFile), match.group(1)) if match else []
        if not values or exc.hint is not None:
            raise
        raise ConfigError(exc.source, exc.line, exc.reason, hint=f"one of: {', '.join(values)}") from None


def parse_policy(text: str, source: str = "<policy>") -> LoadedPolicy:
    """Parse and check a policy's structure and references; plugin names are checked by the engine."""
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, lines.get((), 1), "a policy file is a mapping with `classes` and `routes`")
    routes = data.get("routes")
    if isinstance(routes, dict):
        for name, route in routes.items():  # one by one, so an error names the route's line
            _decode(route, lines, Route, source, prefix=("routes", name))
    policy = _decode(data, lines, PolicyFile, source)
    loaded = LoadedPolicy(source=source, policy=policy, lines=lines, version=policy_version(text))
    _check_references(loaded)
    for route in policy.routes.values():
        if route.shed and route.backpressure is None:
            route.backpressure = SHED_BACKPRESSURE
    policy.headers = {
        header.lower(): {value.strip().lower(): cls for value, cls in values.items()}
        for header, values in policy.headers.items()
    }
    return loaded


def policy_version(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def load_policy(path: str | Path) -> LoadedPolicy:
    return parse_policy(read_text(path, "policy file"), str(path))
