"""A simulated fleet and a gateway in front of it, for one policy: started fresh, stopped afterwards.

Each policy gets new backend processes (cold prefix caches, empty queues) and a new gateway (an empty
ledger), so no policy inherits another's state. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import FleetSpec
from loadtest.guard import require_loopback
from loadtest.processes import ProcessGroup, free_port, wait_until
from policies.presets import preset_names, resolve

BASELINES_DIR = Path(__file__).parent / "baselines"
_ROOT = Path(__file__).resolve().parents[1]
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def baseline_names() -> list[str]:
    return sorted(p.stem for p in BASELINES_DIR.glob("*.yaml"))


def policy_file(name: str) -> Path:
    """A preset, a built-in baseline (`round-robin`, `least-loaded`), or a policy file's path."""
    if name in baseline_names():
        return BASELINES_DIR / f"{name}.yaml"
    if name in preset_names():
        return resolve(name)
    path = Path(name)
    if not path.is_file():
        known = ", ".join([*preset_names(), *baseline_names()])
        raise ValueError(f"policy `{name}` is neither a preset, a baseline nor a file (known: {known})")
    return path.resolve()


def get_json(url: str, timeout: float = 10.0) -> Any:
    with _NO_PROXY.open(require_loopback(url), timeout=timeout) as response:
        return json.loads(response.read())


def _status(url: str) -> int:
    try:
        with _NO_PROXY.open(url, timeout=1.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def gateway_config(fleet: Fleet, policy: Path, port: int) -> dict[str, Any]:
    config = fleet.gateway_config(
        host="127.0.0.1",
        port=port,
        scrape={"interval": 0.25, "timeout": 1.0},
        health={"interval": 1.0},
        shutdown_grace=2.0,
        # the load generator is one address standing for many clients: its open requests (up to the
        # scenario's max_inflight, held ones included) must not meet the per-client connection cap
        connections={"max_per_client": 10_000},
    )
    # the gateway measures real seconds; the simulated fleet runs time_scale times faster
    config["policy"] = {"file": str(policy), "reload_interval": 60.0, "clock_scale": fleet.spec.time_scale}
    config["ledger"] = {"store": "memory", "bucket_seconds": 10}
    return config


@contextlib.contextmanager
def serving_gateway(
    config_for: Callable[[int], dict[str, Any]], workdir: Path, log_level: str = "warning"
) -> Iterator[str]:
    """`switchyard serve` on a free port with the config `config_for(port)` gives, stopped (with all it
    started) on the way out; yields its base URL once /ready. The access log follows `log_level`: at
    `warning` it is silent."""
    port = free_port()
    config_path = workdir / "gateway.yaml"
    config_path.write_text(yaml.safe_dump(config_for(port), sort_keys=False))
    group = ProcessGroup(workdir)
    try:
        argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config_path)]
        # An open gateway read without a key: the shell's admin key (a weak one stops it) is not its.
        env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_ADMIN_KEY"}
        child = group.start("gateway", [*argv, "--log-level", log_level], env=env, cwd=str(_ROOT))
        base = f"http://127.0.0.1:{port}"
        wait_until(lambda: _status(base + "/ready") == 200, timeout=60, what="gateway", child=child)
        yield base
    finally:
        group.close()  # the gateway writes what it still buffers as it stops


@contextlib.contextmanager
def running_stack(spec: FleetSpec, policy: str, workdir: Path) -> Iterator[str]:
    """Start the fleet and a gateway routing by `policy`; yields the gateway's base URL."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = policy_file(policy)
    with (
        Fleet(spec, log_dir=workdir / "fleet", startup_timeout=60.0) as fleet,
        serving_gateway(lambda port: gateway_config(fleet, path, port), workdir) as base,
    ):
        yield base
