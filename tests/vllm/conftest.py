"""Two real vLLM CPU servers of the tiny model and the gateway in front of them, for the whole session.

Only `make test-vllm` runs this directory: it sets SWITCHYARD_VLLM=1 plus the vLLM virtualenv's python and
the tiny model's folder (both cached outside the repo). Without SWITCHYARD_VLLM=1 nothing here is collected,
so `make test` pays nothing for it.

The servers stand in for one backend of an AMD MI300X pool and one of an NVIDIA H100 pool. The "H100" one
runs with `--max-num-seqs 2`, so under concurrent load its requests queue (`vllm:num_requests_waiting`)
and queue-aware routing should send the load to the other. The gateway routes the default class with
`least-outstanding` over both pools; a backend with any request waiting in vLLM's queue counts
as saturated and is tried after the other. Every process runs in its own process group and is killed
at the end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.launcher import Launch, LaunchSpec, build_launch
from backends.server_process import log_tail, start, stop, wait_ready
from tests.support import free_port, metric, running_gateway, sim_metrics

if os.environ.get("SWITCHYARD_VLLM") != "1":
    collect_ignore_glob = ["test_*.py"]

MODEL = "tiny-llama"
MAX_MODEL_LEN = 512
READY_TIMEOUT = float(os.environ.get("SWITCHYARD_VLLM_READY_TIMEOUT", "300"))
AMD, NVIDIA = "mi300x-0", "h100-0"
QUEUED = NVIDIA
"""The backend started with --max-num-seqs 2."""


@dataclass
class Server:
    name: str
    pool: str
    vendor: str
    accelerator: str
    launch: Launch
    log: Path
    max_num_seqs: int | None

    @property
    def url(self) -> str:
        return self.launch.url

    def metrics(self) -> dict[str, float]:
        return sim_metrics(self.url)

    def gauge(self, name: str) -> float:
        return metric(self.metrics(), name)


@dataclass
class VllmEnv:
    base_url: str
    servers: dict[str, Server]
    workdir: Path
    counters_at_start: dict[str, dict[str, float]] = field(default_factory=dict)
    outside: dict[str, dict[str, float]] = field(default_factory=dict)
    """Tokens a server served to tests directly, not through the gateway (the ledger never sees them)."""
    abandoned_generated: dict[str, float] = field(default_factory=dict)
    """Per server, how many tokens vLLM generated for the streams a test abandoned mid-way (see test_e2e's
    ledger check), until the abort reached its engine."""
    abandoned_seen: dict[str, int] = field(default_factory=dict)
    """Per server, how many of them reached the client before it went away."""

    def served_outside(self, name: str, prompt_tokens: int, completion_tokens: int) -> None:
        counted = self.outside.setdefault(name, {"prompt_tokens": 0, "completion_tokens": 0})
        counted["prompt_tokens"] += prompt_tokens
        counted["completion_tokens"] += completion_tokens

    def counters(self, name: str) -> dict[str, float]:
        values = self.servers[name].metrics()
        return {
            "prompt_tokens": metric(values, "vllm:prompt_tokens_total"),
            "completion_tokens": metric(values, "vllm:generation_tokens_total"),
        }

    def usage_by_backend(self) -> dict[str, dict[str, Any]]:
        r = httpx.get(self.base_url + "/admin/v1/usage", params={"by": "backend"}, trust_env=False)
        r.raise_for_status()
        return {row["name"]: row for row in r.json()["data"]}

    def wait_idle(self, timeout: float = 60.0) -> None:
        """Until both servers run and queue nothing (so their counters are final)."""
        deadline = time.monotonic() + timeout
        for server in self.servers.values():
            while True:
                values = server.metrics()
                busy = metric(values, "vllm:num_requests_running") + metric(
                    values, "vllm:num_requests_waiting"
                )
                if busy == 0:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"{server.name} still busy ({busy} requests) after {timeout} s")
                time.sleep(0.2)


def _python() -> str:
    python = os.environ.get("SWITCHYARD_VLLM_PYTHON", "")
    if not python or not Path(python).is_file():
        pytest.fail("SWITCHYARD_VLLM_PYTHON must name the vLLM virtualenv's python (run `make test-vllm`)")
    return python


def _model() -> str:
    model = os.environ.get("SWITCHYARD_VLLM_MODEL", "")
    if not model or not (Path(model) / "config.json").is_file():
        pytest.fail("SWITCHYARD_VLLM_MODEL must name the tiny model's folder (run `make test-vllm`)")
    return model


@pytest.fixture(scope="session")
def vllm_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmEnv]:
    workdir: Path = tmp_path_factory.mktemp("vllm")
    python, model = _python(), _model()
    plan = [
        (AMD, "mi300x", "amd", "mi300x", None),
        (NVIDIA, "h100", "nvidia", "h100", 2),
    ]
    servers: dict[str, Server] = {}
    cores = os.cpu_count() or 1
    for index, (name, pool, vendor, accelerator, max_num_seqs) in enumerate(plan):
        launch = build_launch(
            LaunchSpec(
                vendor="cpu",
                model=model,
                served_model_name=[MODEL],
                python=python,
                port=free_port(),
                max_model_len=MAX_MODEL_LEN,
                max_num_seqs=max_num_seqs,
                # One core each: two servers on a 2-core machine do not fight over the same core.
                env={"VLLM_CPU_OMP_THREADS_BIND": str(index % cores) if cores > 1 else "nobind"},
            )
        )
        servers[name] = Server(name, pool, vendor, accelerator, launch, workdir / f"{name}.log", max_num_seqs)
    processes = []
    try:
        for server in servers.values():
            processes.append(start(server.launch, server.log))
        started = time.monotonic()
        with ThreadPoolExecutor(len(servers)) as pool:
            waits = [
                pool.submit(wait_ready, s.url, p, s.log, READY_TIMEOUT)
                for s, p in zip(servers.values(), processes, strict=True)
            ]
            for wait in waits:
                wait.result()
        print(f"\nvLLM servers ready in {time.monotonic() - started:.1f} s")

        policy = workdir / "spread.yaml"
        policy.write_text(
            "name: spread\nroutes:\n  default:\n    prefer: any\n    saturation: {max_waiting: 0}\n"
            "    strategy: {least-outstanding: 1}\n"
        )
        config: dict[str, Any] = {
            "gateway": {
                "timeouts": {"connect": 2.0, "first_byte": 120.0, "between_chunks": 60.0},
                "health": {"interval": 1.0, "timeout": 2.0},
                "scrape": {"interval": 0.2, "timeout": 1.0},
            },
            "policy": {"file": str(policy)},
            "pools": [
                {
                    "name": s.pool,
                    "vendor": s.vendor,
                    "accelerator": s.accelerator,
                    "price_per_gpu_hour": 1.75 if s.vendor == "amd" else 2.90,
                    "backends": [
                        {"name": s.name, "url": s.url, "models": [MODEL], "max_model_len": MAX_MODEL_LEN}
                    ],
                }
                for s in servers.values()
            ],
        }
        env = VllmEnv(base_url="", servers=servers, workdir=workdir)
        env.counters_at_start = {name: env.counters(name) for name in servers}
        with running_gateway(config, workdir) as base:
            env.base_url = base
            _wait_gateway_ready(base, workdir)
            yield env
    except Exception as exc:
        tails = "\n".join(f"--- {s.name} ({s.log}):\n{log_tail(s.log, 15)}" for s in servers.values())
        raise RuntimeError(f"{exc}\n{tails}") from exc
    finally:
        for process in processes:
            stop(process)


def _wait_gateway_ready(base: str, workdir: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        r = httpx.get(base + "/ready", trust_env=False)
        if r.status_code == 200:
            return
        if time.monotonic() > deadline:
            log = (workdir / "gateway.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"gateway not ready within {timeout} s: {r.text}\n{log}")
        time.sleep(0.2)
