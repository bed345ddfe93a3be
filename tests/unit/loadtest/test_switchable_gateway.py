"""The gateway loadtest.bench.telemetry switches between telemetry modes: each wires what it says, no more."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import yaml

from backends.lifetime import die_with_parent
from tests.support import ROOT, RecordingBackend, free_port

MODEL = "bench-model"


@contextlib.contextmanager
def switchable(tmp_path: Path, backend_url: str) -> Iterator[tuple[str, Path, int]]:
    port = free_port()
    config = {
        "pools": [
            {
                "name": "p",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [{"url": backend_url, "models": [MODEL], "max_model_len": 4096}],
            }
        ],
        "ledger": {"store": "memory"},
        "telemetry": {
            "access_log": {"destination": str(tmp_path / "access.log")},
            "tracing": {"enabled": True, "exporter": "none"},
        },
    }
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    mode_file = tmp_path / "mode"
    mode_file.write_text("off")
    argv = [
        sys.executable, "-m", "loadtest.bench.switchable_gateway", "--config", str(tmp_path / "gateway.yaml"),
        "--port", str(port), "--mode-file", str(mode_file), "--otlp", "http://127.0.0.1:9/v1/traces",
    ]  # fmt: skip
    with (tmp_path / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, (tmp_path / "gateway.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, "the switchable gateway did not start"
            time.sleep(0.05)
        yield base, mode_file, process.pid
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=15)


def requests_counted(base: str) -> float:
    total = 0.0
    for line in httpx.get(base + "/metrics").text.splitlines():
        if line.startswith("switchyard_requests_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_each_mode_wires_what_it_names(tmp_path: Path) -> None:
    with RecordingBackend(MODEL) as backend, switchable(tmp_path, backend.url) as (base, mode_file, pid):
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        log = tmp_path / "access.log"
        seen: dict[str, tuple[float, int, str | None]] = {}
        for mode in ("off", "metrics+logs", "all", "off-twin"):
            mode_file.write_text(mode)
            os.kill(pid, signal.SIGUSR1)
            time.sleep(0.3)
            client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
            time.sleep(0.3)  # the telemetry batch is written every 100 ms
            lines = len(log.read_text().splitlines()) if log.exists() else 0
            traceparent = {k.lower(): v for k, v in backend.requests[-1][1].items()}.get("traceparent")
            seen[mode] = (requests_counted(base), lines, traceparent)
    assert seen["off"][:2] == (0.0, 0) and seen["off"][2] is None
    assert seen["metrics+logs"][:2] == (1.0, 1) and seen["metrics+logs"][2] is None
    assert seen["all"][:2] == (2.0, 2) and seen["all"][2] is not None and seen["all"][2].endswith("-01")
    assert seen["off-twin"] == (2.0, 2, None)  # off again: nothing counted, logged or traced
