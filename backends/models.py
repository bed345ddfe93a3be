"""Pools and backends: what the config file declares and what the gateway tracks about each at run time."""

from __future__ import annotations

import logging
import os
from dataclasses import KW_ONLY, InitVar, dataclass, field, replace
from typing import Annotated

import msgspec

from backends.accelerators import GUESS, Vendor, calibrated, find, guess_note, priors
from backends.breaker import Breaker, BreakerOptions
from backends.calibrated import StepFit
from backends.drift import ProfileDrift
from backends.model_size import REFERENCE_PARAMS_B, params_b_from_names

log = logging.getLogger("switchyard.backends")

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
_Url = Annotated[str, msgspec.Meta(pattern=r"^https?://[^\s/]+(/[^\s]*)?$")]
_EnvName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]


class BackendConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One vLLM server as the config file declares it."""

    url: _Url
    models: Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(min_length=1)]
    max_model_len: Annotated[int, msgspec.Meta(gt=0)]
    name: _Name | None = None
    api_key_env: _EnvName | None = None


class PoolConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """A group of identical backends on one kind of accelerator, priced per GPU-hour."""

    name: _Name
    vendor: Vendor
    accelerator: Annotated[str, msgspec.Meta(min_length=1)]
    price_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)]
    backends: Annotated[list[BackendConfig], msgspec.Meta(min_length=1)]
    gpus_per_backend: Annotated[int, msgspec.Meta(ge=1)] = 1
    labels: dict[str, str] = {}
    model_params_b: Annotated[float, msgspec.Meta(gt=0, le=10_000)] | None = None
    """Billions of parameters of the model its backends serve, where their model names do not say it
    (`Llama-3.1-70B-Instruct` says 70): what the latency priors and `saturation.max_slowdown` scale by."""


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    vendor: Vendor
    accelerator: str
    gpus_per_backend: int
    price_per_gpu_hour: float
    labels: dict[str, str]
    memory_gb: float = 0.0
    """GPU memory behind one backend (all its GPUs), from the accelerator's facts."""
    prior_ttft_s: float = 0.05
    """Time to first token to assume before any is measured."""
    prior_tpot_s: float = 0.01
    """Time per output token to assume before any is measured."""
    light_load_tpot_s: float | None = None
    """Time per output token of its model on its accelerators at light load (the weights read once a
    step), where both are known: what a route's `saturation.max_slowdown` is relative to."""
    model_scale: float = 1.0
    """Its model's size over the 8B the accelerator facts are for (1 when unknown)."""
    cost_floor_per_mtok: float = 0.0
    """USD per million tokens at the accelerator's saturated throughput: the cost before one is measured."""
    accelerator_guess: str | None = None
    """What is guessed for an accelerator the catalogue (backends/accelerators.py) does not know; None
    for a known one."""
    calibrated: bool = False
    """Its priors are a profile measured on one of its backends (`switchyard calibrate`), not the
    datasheet's."""
    measured_tokens_per_s: float | None = None
    """A calibrated pool's measured saturated throughput per backend."""
    step: StepFit | None = None
    """A calibrated pool's measured step-time model (what its drift is measured against)."""
    backend_price_per_second: float = field(init=False, compare=False)
    """USD per second that one backend of this pool costs, busy or idle (read for every request's cost:
    worked out once, not in a property)."""

    def __post_init__(self) -> None:
        price = self.price_per_gpu_hour * self.gpus_per_backend / 3600.0
        object.__setattr__(self, "backend_price_per_second", price)  # frozen

    @property
    def saturated_tokens_per_s(self) -> float:
        """Output tokens per second one backend of this pool serves at a saturated batch, from its
        accelerator's facts for its model's size: its cost floor and the gateway's prefill-speed prior."""
        if self.measured_tokens_per_s:
            return self.measured_tokens_per_s
        return priors(self.accelerator).tokens_per_second * self.gpus_per_backend / self.model_scale


@dataclass(slots=True)
class EngineLoad:
    """vLLM's engine gauges, scraped from GET /metrics in the background."""

    running: float = 0.0
    waiting: float = 0.0
    kv_cache_usage: float = 0.0
    scraped_at: float | None = None
    """Monotonic time of the last successful scrape; None if never scraped."""


@dataclass(slots=True)
class Observed:
    """Exponentially weighted averages of latencies measured by the gateway (seconds; None before data)."""

    ttft: float | None = None
    tpot: float | None = None
    weight: float = 0.2

    def add(self, ttft: float | None, tpot: float | None) -> None:
        w = self.weight
        if ttft is not None:
            self.ttft = ttft if self.ttft is None else self.ttft + w * (ttft - self.ttft)
        if tpot is not None:
            self.tpot = tpot if self.tpot is None else self.tpot + w * (tpot - self.tpot)


@dataclass(slots=True, eq=False)
class Backend:
    """A backend at run time: its identity plus the live state the router reads."""

    name: str
    url: str
    models: frozenset[str]
    max_model_len: int
    pool: Pool
    api_key: str | None = field(default=None, repr=False)
    healthy: bool = True
    """Whether routing may send it new requests; kept by `breaker.refresh()` from the state below."""
    health_ok: bool = True
    """Its active health checks pass (backends/health.py)."""
    draining: bool = False
    """An operator drained it: no new requests, the in-flight ones finish."""
    inflight: int = 0
    """Requests this gateway has sent and not yet finished."""
    inflight_by_class: dict[str, int] = field(default_factory=dict)
    """The same requests by their policy class (classes with none in flight may be absent or 0)."""
    prompt_tokens_by_class: dict[str, int] = field(default_factory=dict)
    """The estimated prompt tokens of those requests, by class: what they keep in the KV cache and, while
    prefilling, what slows every decode step beside them."""
    inflight_seqs: int = 0
    """The sequences those requests hold in the backend's running batch: a request with `n` choices
    holds n of vLLM's `max_num_seqs` seats."""
    measured_cost_per_mtok: float | None = None
    """Effective USD per million tokens measured by the ledger (None until it has data); kept fresh in the
    background so routing reads it without I/O."""
    load: EngineLoad = field(default_factory=lambda: EngineLoad())
    """What the backend's own /metrics said at the last scrape."""
    observed: Observed = field(default_factory=lambda: Observed())
    """Latency this gateway measured on its recent requests to the backend."""
    breaker: Breaker = field(init=False, repr=False)
    """Its circuit breaker (backends/breaker.py), fed by the request path."""
    drift: ProfileDrift = field(default_factory=lambda: ProfileDrift())
    """Measured latency over its pool profile's prediction (backends/drift.py)."""
    _: KW_ONLY
    breaker_options: InitVar[BreakerOptions | None] = None
    """Its breaker's thresholds (`gateway.breaker`); the defaults without."""

    def __post_init__(self, breaker_options: BreakerOptions | None) -> None:
        self.breaker = Breaker(self, breaker_options)

    @property
    def vendor(self) -> Vendor:
        return self.pool.vendor


def build_backends(
    pools: list[PoolConfig],
    environ: dict[str, str] | None = None,
    *,
    breaker: BreakerOptions | None = None,
) -> list[Backend]:
    """Turn validated pool configs into run-time backends, resolving API keys from the environment; each
    backend's breaker has the options `breaker` (the defaults without)."""
    env = os.environ if environ is None else environ
    backends: list[Backend] = []
    for pool_config in pools:
        kind = pool_config.accelerator.lower()
        record = find(kind)
        facts = priors(kind)
        guess = guess_note(pool_config.accelerator)
        if guess is not None:
            log.warning("pool %s: %s", pool_config.name, guess)
        elif record is not None and record.vendor != pool_config.vendor:
            log.warning(
                "pool %s: accelerator `%s` is an %s GPU (backends/accelerators.py), not %s",
                pool_config.name, pool_config.accelerator, record.vendor, pool_config.vendor,
            )  # fmt: skip
        gpus = pool_config.gpus_per_backend
        models = [name for cfg in pool_config.backends for name in cfg.models]
        measured = next((m for m in (calibrated(kind, n) for n in models) if m is not None), None)
        params_b = pool_config.model_params_b or params_b_from_names(
            name for cfg in pool_config.backends for name in cfg.models
        )
        scale = params_b / REFERENCE_PARAMS_B if params_b is not None else 1.0
        # a known size scales every prior alike; an accelerator the facts do not know gives a guess, which
        # may predict but sets no `max_slowdown` mark (that refuses work)
        scaled_tpot = facts.tpot_s * scale / gpus if params_b is not None else facts.tpot_s
        light_load_tpot = scaled_tpot if params_b is not None and record is not None else None
        pool = Pool(
            name=pool_config.name,
            vendor=pool_config.vendor,
            accelerator=kind,
            gpus_per_backend=gpus,
            price_per_gpu_hour=pool_config.price_per_gpu_hour,
            labels=dict(pool_config.labels),
            memory_gb=(record.datasheet.memory_gb if record is not None else GUESS.memory_gb) * gpus,
            prior_ttft_s=facts.ttft_s,
            prior_tpot_s=scaled_tpot,
            light_load_tpot_s=light_load_tpot,
            model_scale=scale,
            accelerator_guess=guess,
        )
        if measured is not None:  # measured on this accelerator for this model: no scaling, no guess
            facts = measured[1].priors()
            pool = replace(
                pool,
                prior_ttft_s=facts.ttft_s,
                prior_tpot_s=facts.tpot_s,
                light_load_tpot_s=facts.tpot_s,
                model_scale=1.0,
                calibrated=True,
                measured_tokens_per_s=facts.tokens_per_second or None,
                step=measured[1].step,
            )
        floor = pool.backend_price_per_second / pool.saturated_tokens_per_s * 1e6
        pool = replace(pool, cost_floor_per_mtok=floor)
        for index, cfg in enumerate(pool_config.backends):
            backends.append(
                Backend(
                    name=cfg.name or f"{pool.name}-{index}",
                    url=cfg.url.rstrip("/"),
                    models=frozenset(cfg.models),
                    max_model_len=cfg.max_model_len,
                    pool=pool,
                    api_key=env.get(cfg.api_key_env) if cfg.api_key_env else None,
                    breaker_options=breaker,
                )
            )
    return backends
