"""The check's legs: a simulator of a profile, and a gateway in front of each server the load goes to.

The real server's gateway writes the access log the what-if replay reads (loadtest/calibrate/agreement.py);
a simulator's gateway writes none. Every gateway has one pool of one backend, the check's policy (two
classes, named by each request's `x-switchyard-class`) and the gateway's default scrape interval, so the
real server and the simulators pay the same hop and the same scrapes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from backends.lifetime import die_with_parent, stop_process
from loadtest.processes import free_port
from loadtest.stack import serving_gateway

POOL = "calibrated"
SCRAPE_S = 1.0
"""The gateways' /metrics scrape interval (their default), and the replay's."""
WRONG = ["--gpu", "mi300x", "--model-profile", "llama-3.1-8b"]
"""The built-in MI300X datasheet profile serving an 8B model: what a fresh install assumes."""
_ROOT = Path(__file__).resolve().parents[2]


def calibrated_timing(profile: Path) -> list[str]:
    return ["--calibrated", str(profile)]


def write_policy(path: Path) -> Path:
    """Two classes, named by each request's `x-switchyard-class` (their rules never match on their own)."""
    path.write_text(
        "name: calibrate-check\n"
        "classes:\n"
        "  - name: chat\n    when: {n: {gt: 16}}\n"
        "  - name: bulk\n    when: {n: {gt: 16}}\n"
        "routes:\n"
        "  chat: {strategy: {least-outstanding: 1}}\n"
        "  bulk: {strategy: {least-outstanding: 1}}\n"
        "  default: {strategy: {least-outstanding: 1}}\n"
    )
    return path


def gateway_config(
    url: str, model: str, max_model_len: int, policy: Path, access_log: Path | None
) -> dict[str, Any]:
    """One pool of one backend at `url`; `access_log`: where the gateway writes its access log."""
    telemetry = {"access_log": {"destination": str(access_log)}} if access_log is not None else {}
    return {
        "gateway": {"timeouts": {"first_byte": 120.0}, "scrape": {"interval": SCRAPE_S, "timeout": 1.0}},
        "policy": {"file": str(policy)},
        "telemetry": telemetry,
        "pools": [
            {
                "name": POOL,
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [{"name": "b-0", "url": url, "models": [model], "max_model_len": max_model_len}],
            }
        ],
    }


def held_apart_only(access_log: Path) -> None:
    """Keeps in `access_log` only the requests that named their class (`x-switchyard-class`): the
    held-apart load's, where a sweep sent through the same gateway (`Options.through`) names none."""
    lines = access_log.read_bytes().splitlines(keepends=True)
    access_log.write_bytes(b"".join(line for line in lines if json.loads(line).get("class_header")))


def running_gateway(config: dict[str, Any], workdir: Path) -> contextlib.AbstractContextManager[str]:
    """`switchyard serve` with `config` on a free port, stopped on the way out; yields its base URL.
    At log level `info`, so it writes its access log."""
    workdir.mkdir(parents=True, exist_ok=True)
    return serving_gateway(
        lambda port: {**config, "gateway": {**config["gateway"], "port": port}}, workdir, "info"
    )


@contextlib.contextmanager
def gateway_in_front(url: str, model: str, max_model_len: int, workdir: Path) -> Iterator[str]:
    """A gateway of the check's shape in front of the server at `url` (no access log), for a sweep that
    sends through it (`switchyard calibrate --through-gateway`); yields its base URL."""
    policy = write_policy(workdir / "policy.yaml")
    config = gateway_config(url, model, max_model_len, policy, None)
    with running_gateway(config, workdir / "gateway") as base:
        yield base


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def start_simulator(
    timing: Sequence[str], model: str, max_model_len: int, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m backends.sim <timing>` on a free port (`timing`: `--calibrated profile.yaml`, or a
    datasheet profile's `--gpu mi300x --model-profile llama-3.1-8b`); returns it and its URL once healthy."""
    port = free_port()
    command = [sys.executable, "-m", "backends.sim", "--port", str(port), "--model", model]
    command += ["--max-model-len", str(max_model_len), "--name", "simulated", *timing]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(_ROOT), os.environ.get("PYTHONPATH")])),
    }
    with log.open("wb") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent(),  # gone with this process, whatever ends it
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"the simulator exited: {log.read_text(errors='replace')[-2000:]}")
        if _healthy(url):
            return process, url
        if time.monotonic() > deadline:
            stop_process(process)
            raise RuntimeError("the simulator did not start within 20 s")
        time.sleep(0.1)
