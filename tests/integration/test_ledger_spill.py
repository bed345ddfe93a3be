"""Records buffered while Redis is away survive SIGTERM and SIGKILL of the gateway, and count exactly once.

The test runs its own `redis-server` on a free port (never the shared one on 6379) and stops it to make
Redis unreachable; the gateway forwards to a recording backend that reports 3 prompt + 1 completion tokens.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.lifetime import die_with_parent, stop_process
from tests.support import ROOT, RecordingBackend, free_port, running_gateway

REQUESTS = 25
BODY = {"model": "echo-model", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class PrivateRedis:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        """Stop it and keep nothing: the data it held is lost, as after a crash without persistence."""
        if self.process is not None:
            stop_process(self.process)
            self.process = None


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _config(recorder: RecordingBackend, redis_url: str, spill: Path) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "rec",
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [{"url": recorder.url, "models": ["echo-model"], "max_model_len": 4096}],
            }
        ],
        "ledger": {
            "store": "redis",
            "redis_url": redis_url,
            "key_prefix": "spilltest-" + uuid.uuid4().hex[:8],
            "flush_interval": 0.1,
            "redis_timeout": 0.3,
            "spill_path": str(spill),
        },
        "gateway": {"shutdown_grace": 2.0},
        "telemetry": {"access_log": {"enabled": False}},
    }


def _model_totals(base: str) -> dict[str, Any] | None:
    reply = httpx.get(base + "/admin/v1/usage?by=model", timeout=5)
    if reply.status_code != 200:
        return None
    rows = {row["name"]: row for row in reply.json()["data"]}
    return rows.get("echo-model")


def _wait_for_totals(base: str, requests: int, timeout: float = 10) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    row = None
    while time.monotonic() < deadline:
        row = _model_totals(base)
        if row is not None and row["requests"] >= requests:
            return row
        time.sleep(0.1)
    raise AssertionError(f"totals did not reach {requests} requests: {row}")


@pytest.mark.slow
@pytest.mark.parametrize("kill", [signal.SIGTERM, signal.SIGKILL])
def test_records_buffered_while_redis_is_down_survive_the_gateway(
    tmp_path: Path, redis_server: PrivateRedis, kill: signal.Signals
) -> None:
    spill = tmp_path / "ledger.spill"
    with RecordingBackend("echo-model") as recorder:
        config = _config(recorder, redis_server.url, spill)
        with _gateway(config, tmp_path / "first") as (base, process):
            with httpx.Client(base_url=base, timeout=10) as client:
                assert client.post("/v1/chat/completions", json=BODY).status_code == 200
                _wait_for_totals(base, 1)  # Redis works: one request counted
                redis_server.stop()
                for _ in range(REQUESTS):
                    assert client.post("/v1/chat/completions", json=BODY).status_code == 200
            time.sleep(1.0)  # the flusher finds Redis gone and spills (within flush_interval)
            os.killpg(process.pid, kill)
            process.wait(timeout=15)
        assert len(spill.read_bytes().splitlines()) == REQUESTS
        redis_server.start()  # empty: nothing persisted; the first request's count is gone with it
        with running_gateway(config, tmp_path / "second") as base:
            row = _wait_for_totals(base, REQUESTS)
            assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (
                REQUESTS,
                3 * REQUESTS,
                1 * REQUESTS,
            )
            deadline = time.monotonic() + 5
            while spill.exists() and spill.stat().st_size and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not spill.exists() or spill.stat().st_size == 0
        with running_gateway(config, tmp_path / "third") as base:  # replayed once, not again
            time.sleep(0.5)
            row = _model_totals(base)
            assert row is not None and row["requests"] == REQUESTS


@contextlib.contextmanager
def _gateway(config: dict[str, Any], workdir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """Like tests.support.running_gateway, but yields the process too, for the test to kill."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump({**config, "gateway": {**config["gateway"], "port": port}}))
    with (workdir / "gateway.log").open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
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
                assert process.poll() is None, (workdir / "gateway.log").read_text()
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(base + "/health", timeout=1).status_code == 200:
                        break
                assert time.monotonic() < deadline, "gateway did not start"
                time.sleep(0.05)
            yield base, process
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
