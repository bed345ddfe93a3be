"""A simulated copy of a fleet in one process: for each backend of a fleet file, the `Backend` routing reads
(backends/models.py, built exactly as the gateway builds it from its config) beside the simulator's own
engine state (backends/sim: the scheduler, its KV-cache block pool and the GPU performance model).

Groups without a GPU profile are fixed-timing backends (`ttft_ms`, `tpot_ms` whatever the load), as the
HTTP simulator runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from backends.models import Backend, PoolConfig, build_backends
from backends.sim.fleet_spec import FleetSpec
from backends.sim.frontend import FrontEnd
from backends.sim.metrics import EngineStats
from backends.sim.perf import PerfModel
from backends.sim.profiles import Hardware
from backends.sim.scheduler import Group, Scheduler
from backends.sim.spells import spell_seed


@dataclass(eq=False, slots=True)
class SimBackend:
    backend: Backend
    model: str
    hardware: Hardware | None
    ttft_s: float
    tpot_s: float
    stats: EngineStats = field(init=False)
    scheduler: Scheduler | None = None
    perf: PerfModel | None = None
    stepping: bool = False
    """Whether a step is scheduled (the engine loop is running)."""
    fixed_open: int = 0
    """Requests in flight on a fixed-timing backend."""
    busy_s: float = 0.0
    """Seconds the engine spent in steps (utilisation)."""
    plan: Any = None
    """The step in flight (`Scheduler.plan`), applied when it ends."""
    draw: int = 0
    """Which draw of a calibrated backend's slow spells this replay runs (backends/sim/spells.py)."""
    front: FrontEnd = field(init=False)
    """A calibrated server's front end (it takes one request at a time)."""

    def __post_init__(self) -> None:
        self.stats = EngineStats(model_name=self.model, kv_capacity_tokens=0)
        seed = spell_seed(self.backend.name, self.draw)
        self.front = FrontEnd(self.hardware.request_cv() if self.hardware is not None else 0.0, seed)
        if self.hardware is not None:
            self.scheduler = Scheduler(self.hardware.limits, self.hardware.num_blocks, self.stats)
            self.perf = PerfModel(self.hardware, seed)

    def enter(
        self, prompt_tokens: int, hashes: list[int], lengths: list[int], reasons: list[str], now: float
    ) -> Group:
        """A request sent to this backend at `now`, queued for its scheduler: a calibrated server's front
        end (HTTP, tokenisation) and a busy engine's admission wait delay it (backends/calibrated.py)."""
        assert self.scheduler is not None and self.hardware is not None
        running = self.scheduler.stats.running
        front_end = self.hardware.front_end(running)
        arrival = self.front.leave(now, front_end)
        group = Group(prompt_tokens, hashes, lengths, reasons, arrival=arrival)
        group.ready = arrival + self.hardware.admission_wait(running)
        self.scheduler.add(group)
        return group

    def leaves_front_end(self, now: float) -> float | None:
        """When the head of the queue leaves a calibrated server's front end, if after `now`."""
        waiting = self.scheduler.waiting if self.scheduler is not None else None
        return waiting[0].ready if waiting and waiting[0].ready > now else None

    @property
    def kv_capacity_tokens(self) -> int | None:
        return self.hardware.kv_capacity_tokens if self.hardware is not None else None

    def scrape(self, now: float) -> None:
        """What the gateway's scraper would read from this backend's /metrics right now."""
        load = self.backend.load
        if self.scheduler is not None:
            load.running = float(self.stats.running)
            load.waiting = float(self.stats.waiting)
            load.kv_cache_usage = self.scheduler.pool.usage()
        else:
            load.running = float(self.fixed_open)
            load.waiting = 0.0
            load.kv_cache_usage = 0.0
        load.scraped_at = now


def pool_configs(spec: FleetSpec) -> list[dict[str, Any]]:
    """The pools of a gateway in front of this fleet, as `Fleet.gateway_config` writes them."""
    return [
        {
            "name": group.pool,
            "vendor": group.vendor,
            "accelerator": group.accelerator,
            "price_per_gpu_hour": group.price_per_gpu_hour,
            "gpus_per_backend": group.gpus_per_backend,
            "labels": dict(group.labels),
            "backends": [
                {
                    "name": f"{group.pool}-{i}",
                    "url": f"http://127.0.0.1/{group.pool}-{i}",
                    "models": [group.model or spec.model],
                    "max_model_len": group.max_model_len or spec.max_model_len,
                }
                for i in range(group.count)
            ],
        }
        for group in spec.groups
    ]


def build_fleet(spec: FleetSpec, draw: int = 0) -> list[SimBackend]:
    """Fresh backends (empty queues, cold caches) for one replay; `draw`: which of the calibrated backends'
    slow spells it meets (another draw, another sequence of them)."""
    backends = build_backends(msgspec.convert(pool_configs(spec), list[PoolConfig]), environ={})
    by_pool = {g.pool: g for g in spec.groups}
    return [
        SimBackend(
            backend=backend,
            model=next(iter(backend.models)),
            hardware=by_pool[backend.pool.name].hardware(spec.model),
            ttft_s=by_pool[backend.pool.name].ttft_ms / 1000,
            tpot_s=by_pool[backend.pool.name].tpot_ms / 1000,
            draw=draw,
        )
        for backend in backends
    ]


def gateway_yaml(spec: FleetSpec, policy: str, first_port: int = 8001) -> str:
    """A gateway config for this fleet: one backend per simulated one, at consecutive local ports (edit
    the URLs to your servers'; `switchyard sim fleet --fleet fleet.yaml` serves the simulated ones)."""
    import yaml

    pools = pool_configs(spec)
    port = first_port
    for pool in pools:
        for backend in pool["backends"]:
            backend["url"] = f"http://127.0.0.1:{port}"
            port += 1
    config = {"gateway": {"host": "127.0.0.1", "port": 8000}, "pools": pools, "policy": {"file": policy}}
    header = "# `switchyard plan`: the recommended fleet, with the policy that served it best.\n"
    return header + yaml.safe_dump(config, sort_keys=False)


def fleet_from_gateway_config(path: str) -> FleetSpec:
    """The fleet a gateway config routes to: per pool, its backends timed by the profile measured on its
    `accelerator` for the model they serve if the catalogue has one, else by the GPU profile the
    accelerator names in the catalogue (backends/accelerators.py); raises ConfigError."""
    from backends.accelerators import calibrated, find
    from backends.sim.fleet_spec import GroupSpec
    from backends.yamlfile import ConfigError
    from gateway.config.settings import load_settings

    settings = load_settings(path)
    groups = []
    model = ""
    for pool in settings.pools:
        accelerator = find(pool.accelerator)
        measured = calibrated(pool.accelerator, pool.backends[0].models[0])
        if accelerator is None and measured is None:
            raise ConfigError(
                path, None, f"pool `{pool.name}`: no GPU profile for accelerator `{pool.accelerator}`"
            )
        first = pool.backends[0]
        model = model or first.models[0]
        groups.append(
            GroupSpec(
                pool=pool.name,
                vendor=pool.vendor,
                accelerator=pool.accelerator,
                price_per_gpu_hour=pool.price_per_gpu_hour,
                count=len(pool.backends),
                gpus_per_backend=pool.gpus_per_backend,
                model=first.models[0],
                max_model_len=first.max_model_len,
                labels=dict(pool.labels),
                profile=_profile(measured, accelerator, first.models[0]),
            )
        )
    return FleetSpec(model=model, groups=groups)


def _profile(measured: Any, accelerator: Any, model: str) -> Any:
    """A measured profile where the catalogue has one, else the accelerator's GPU profile."""
    from backends.sim.fleet_spec import ProfileSpec

    if measured is not None:
        return ProfileSpec(calibrated=str(measured[0]))
    assert accelerator is not None  # fleet_from_gateway_config refused a pool with neither
    return ProfileSpec(gpu=accelerator.profile, model=model)
