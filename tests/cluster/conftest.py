"""A local cluster (gateway/cli/cluster.py): Redis, three gateway replicas, HAProxy and a small simulated
fleet.

Only `make test-cluster` runs this directory (it sets SWITCHYARD_CLUSTER=1 and installs HAProxy when
missing); without it nothing here is collected, so `make test` pays nothing for it.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.cli.cluster import Cluster

if os.environ.get("SWITCHYARD_CLUSTER") != "1":
    collect_ignore_glob = ["test_*.py"]

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.9,
      ttft_ms: 5, tpot_ms: 1}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75,
      ttft_ms: 5, tpot_ms: 1}}
"""


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Every process of a test's cluster runs before the test and still runs after it; if not, the test
    fails naming what exited, with its log's tail (a dead balancer otherwise shows as refused connections)."""
    clusters = [value for value in getattr(item, "funcargs", {}).values() if isinstance(value, Cluster)]
    for running in clusters:
        running.check()
    try:
        return (yield)
    finally:
        for running in clusters:
            running.check()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    workdir: Path = tmp_path_factory.mktemp("cluster")
    fleet = workdir / "fleet.yaml"
    fleet.write_text(FLEET)
    with Cluster(workdir, fleet, replicas=3, key_prefix=f"test-cluster-{uuid.uuid4().hex[:8]}") as running:
        yield running


@dataclass
class Outcome:
    request_id: str
    started: float
    ended: float
    status: int
    error: str = ""


@dataclass
class Load:
    """Steady non-streaming traffic through the balancer from a few threads until stopped. The client never
    retries: a request fails if the balancer does not answer it with 200."""

    url: str
    threads: int = 6
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _workers: list[threading.Thread] = field(default_factory=list)

    def _run(self) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
        with httpx.Client(base_url=self.url, timeout=30, trust_env=False) as client:
            while not self._stop.is_set():
                request_id = f"load-{uuid.uuid4().hex}"
                started = time.monotonic()
                status, error = 0, ""
                try:
                    answer = client.post(
                        "/v1/chat/completions", json=body, headers={"x-request-id": request_id}
                    )
                    status = answer.status_code
                    # The ledger keys a request on the id the gateway made (issue 14), not the client's.
                    request_id = answer.headers.get("x-switchyard-request-id", request_id)
                except httpx.HTTPError as exc:
                    error = f"{type(exc).__name__}: {exc}"
                self.outcomes.append(Outcome(request_id, started, time.monotonic(), status, error))

    def __enter__(self) -> Load:
        self._workers = [threading.Thread(target=self._run, daemon=True) for _ in range(self.threads)]
        for worker in self._workers:
            worker.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=60)

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200]

    @property
    def succeeded(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]
