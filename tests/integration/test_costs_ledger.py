"""The Redis ledger end to end: gateway processes, a simulated fleet, the official openai SDK.

Totals in Redis must equal the usage the clients received (each request counted once, by the id the
gateway made), for streaming and non-streaming requests, clients re-using an `x-request-id`, two
gateways sharing one Redis, and a Redis restart mid-run; and the costs of every report add up to the
paid GPU cost (allocated + idle = paid, to the nano-dollar).

The restart test runs its own `redis-server` (never the shared one on 6379) with `--appendonly yes
--appendfsync always`: a real Redis keeps what it acknowledged across a restart, and the gateway relies
on that (it drops a batch from its buffer once Redis acknowledged it). The test kills it with SIGKILL
while traffic flows, so the gateway sees refused connections, buffers, and re-sends on its return.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from gateway.ledger.costs import format_cost_table
from gateway.ledger.keys import Keys
from tests.support import ROOT, free_port, running_gateway

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.90, ttft_ms: 1,
      tpot_ms: 1}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75, ttft_ms: 1,
      tpot_ms: 1}}
"""
SHARED_REDIS = "redis://127.0.0.1:6379/0"
FAST = {"flush_interval": 0.05, "paid_interval": 0.2, "refresh_interval": 0.3}


@dataclass
class Sent:
    """What the clients received: usage per gateway request id (`x-switchyard-request-id`)."""

    usage: dict[str, tuple[str, int, int]] = field(default_factory=dict)
    header_cost: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request_id: str, key: str, prompt: int, completion: int) -> None:
        with self.lock:
            self.usage.setdefault(request_id, (key, prompt, completion))

    def by_key(self) -> dict[str, tuple[int, int, int]]:
        out: dict[str, tuple[int, int, int]] = {}
        for key, prompt, completion in self.usage.values():
            n, p, c = out.get(key, (0, 0, 0))
            out[key] = (n + 1, p + prompt, c + completion)
        return out


def ask(base_url: str, api_key: str, sent: Sent, i: int, request_id: str | None = None) -> None:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=10)
    headers = {"x-request-id": request_id} if request_id else {}
    messages = [{"role": "user", "content": f"question {i} " * (1 + i % 5)}]
    if i % 2:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4 + i % 7,
            stream=True,
            stream_options={"include_usage": True},
            extra_headers=headers,
        )
        usage = None
        for chunk in raw.parse():
            usage = chunk.usage or usage  # the last cumulative usage chunk
        assert usage is not None
    else:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=4 + i % 7,
            extra_headers=headers,
        )
        usage = raw.parse().usage
        assert usage is not None
        with sent.lock:
            sent.header_cost.setdefault(
                raw.headers["x-switchyard-request-id"], float(raw.headers["x-switchyard-cost-usd"])
            )
    if request_id:
        assert raw.headers["x-request-id"] == request_id
    sent.add(raw.headers["x-switchyard-request-id"], api_key, usage.prompt_tokens, usage.completion_tokens)


def key_id(api_key: str) -> str:
    from gateway.request.classify import key_id as hashed

    return hashed(f"Bearer {api_key}")


def wait_for_totals(base_url: str, sent: Sent, timeout: float = 15.0) -> dict[str, Any]:
    expected = {key_id(k): v for k, v in sent.by_key().items()}
    deadline = time.monotonic() + timeout
    while True:
        reply = httpx.get(base_url + "/admin/v1/usage?by=key")
        assert reply.status_code == 200, reply.text
        rows = reply.json()["data"]
        got = {r["name"]: (r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows}
        if got == expected:
            return {r["name"]: r for r in rows}
        if time.monotonic() > deadline:
            raise AssertionError(f"ledger totals {got} != client usage {expected}")
        time.sleep(0.1)


def _delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match=Keys(prefix).pattern, count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    spec = parse_fleet_spec(FLEET, "<costs fleet>")
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("costs-fleet")) as running:
        yield running


def _config(fleet: Fleet, redis_url: str, prefix: str) -> dict[str, Any]:
    config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
    config["ledger"] = {"redis_url": redis_url, "key_prefix": prefix, **FAST}
    return config


@pytest.fixture(scope="module")
def two_gateways(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    prefix = f"itest-{uuid.uuid4().hex[:12]}"
    config = _config(fleet, SHARED_REDIS, prefix)
    try:
        with (
            running_gateway(config, tmp_path_factory.mktemp("gw-a")) as a,
            running_gateway(config, tmp_path_factory.mktemp("gw-b")) as b,
        ):
            yield a, b
    finally:
        _delete_prefix(SHARED_REDIS, prefix)


def test_two_gateways_share_totals_with_retries_and_streams(two_gateways: tuple[str, str]) -> None:
    a, b = two_gateways
    sent = Sent()
    for i in range(16):
        ask(a if i % 3 else b, ("team-a", "team-b")[i % 2], sent, i)
    for i in range(6):  # only non-streaming requests, so every cost is in a header
        ask((a, b)[i % 2], "team-c", sent, i * 2)
    for i in range(4):  # a client re-using its request id, on each replica: two requests, both count
        request_id = f"retry-{uuid.uuid4().hex[:8]}-{i}"
        ask(a, "team-a", sent, 100 + i, request_id)
        ask(b, "team-a", sent, 100 + i, request_id)
    totals = wait_for_totals(a, sent)
    assert wait_for_totals(b, sent) == totals
    team_c = totals[key_id("team-c")]
    header_costs = [cost for rid, cost in sent.header_cost.items() if sent.usage[rid][0] == "team-c"]
    # The ledger keeps nano-USD per request: each record may be rounded by up to half a nano-dollar.
    assert team_c["cost_usd"] == pytest.approx(sum(header_costs), abs=len(header_costs) * 0.5e-9 + 1e-12)
    by_vendor = httpx.get(a + "/admin/v1/usage?by=vendor").json()["data"]
    assert sum(r["requests"] for r in by_vendor) == len(sent.usage)
    ready = httpx.get(a + "/ready").json()
    assert ready["ledger"]["store"] == "redis" and ready["ledger"]["dropped"] == 0
    assert_costs_add_up(a, b)


def assert_costs_add_up(*gateways: str) -> None:
    """Every report of every replica: allocated + idle = paid, to the nano-dollar, row by row for the
    dimensions that own GPUs, and in the sum of the rows for every dimension."""
    for base in gateways:
        for by in ("backend", "pool", "vendor", "model", "key", "class"):
            body = httpx.get(base + f"/admin/v1/costs?by={by}&window=1h").json()
            assert body["idle_cost"] == "idle"
            totals, rows = body["totals"], body["rows"]
            assert totals["paid_nusd"] == totals["allocated_nusd"] + totals["idle_nusd"] > 0
            for row in rows:
                assert row["allocated_nusd"] >= 0 and (row["idle_nusd"] or 0) >= 0
                if by in ("backend", "pool", "vendor"):
                    assert row["paid_nusd"] == row["allocated_nusd"] + row["idle_nusd"]
            assert sum(r["allocated_nusd"] for r in rows) == totals["allocated_nusd"], by
            assert sum(r["idle_nusd"] or 0 for r in rows) == totals["idle_nusd"], by


def _stable(table: str) -> list[list[str]]:
    """The columns of a cost table that do not move while the clock runs (paid time grows)."""
    lines = table.strip("\n").split("\n")
    return [lines[0].split(), lines[1].split()] + [line.split()[:6] for line in lines[2:-1]]


def test_costs_endpoint_and_cli_print_the_same_table(two_gateways: tuple[str, str]) -> None:
    a, _ = two_gateways
    sent = Sent()
    for i in range(4):
        ask(a, "team-d", sent, i)
    deadline = time.monotonic() + 10
    while True:  # the refresher has measured both backends
        rows = httpx.get(a + "/admin/v1/costs?by=backend&window=15m").json()["rows"]
        if all(r["blended_usd_per_mtok"] for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {r["name"] for r in rows} == {"h100-0", "mi300x-0"}
    for r in rows:
        assert r["paid_usd"] > 0 and 0 <= r["utilisation"] <= 1
        assert r["blended_usd_per_mtok"] > 0
        assert r["output_usd_per_mtok"] == pytest.approx(4 * r["input_usd_per_mtok"])
    time.sleep(0.3)
    text = httpx.get(a + "/admin/v1/costs?by=model&window=1h&format=text").text
    cli = subprocess.run(
        [
            str(ROOT / ".venv/bin/python"),
            "-m",
            "gateway.cli",
            "costs",
            "--url",
            a,
            "--by",
            "model",
            "--window",
            "1h",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert cli.returncode == 0, cli.stderr
    assert _stable(cli.stdout) == _stable(text)
    body = httpx.get(a + "/admin/v1/costs?by=model&window=1h").json()
    assert _stable(cli.stdout) == _stable(format_cost_table("model", "1h", body["rows"], body["idle_cost"]))
    assert "(idle)" in text and "total paid" in text
    assert httpx.get(a + "/admin/v1/costs?by=gpu").status_code == 400
    assert httpx.get(a + "/admin/v1/costs?window=2d").status_code == 400


@contextlib.contextmanager
def private_redis(workdir: Path) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A redis-server of our own (AOF, fsync always); yields (url, kill, restart)."""
    port = free_port()
    argv = [
        "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "yes", "--appendfsync", "always", "--dir", str(workdir),
    ]  # fmt: skip
    process: list[subprocess.Popen[bytes]] = []

    def start() -> None:
        process.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(redis.ConnectionError, redis.BusyLoadingError):
                if client.ping():
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.05)
        client.close()

    def kill() -> None:
        process[-1].kill()
        process[-1].wait()

    start()
    try:
        yield f"redis://127.0.0.1:{port}/0", kill, start
    finally:
        kill()


def test_zero_tokens_lost_across_a_redis_restart(fleet: Fleet, tmp_path: Path) -> None:
    with private_redis(tmp_path) as (url, kill, restart):
        config = _config(fleet, url, "outage")
        with running_gateway(config, tmp_path) as gateway:
            sent = Sent()
            failures: list[BaseException] = []
            stop = threading.Event()

            def traffic(offset: int) -> None:
                i = offset
                while not stop.is_set():
                    try:
                        ask(gateway, "team-o", sent, i)
                    except BaseException as exc:
                        failures.append(exc)
                        return
                    i += 2

            threads = [threading.Thread(target=traffic, args=(n,)) for n in range(2)]
            for t in threads:
                t.start()
            time.sleep(0.6)
            kill()
            time.sleep(1.2)
            during = httpx.get(gateway + "/ready").json()["ledger"]
            unreadable = httpx.get(gateway + "/admin/v1/usage?by=key")
            restart()
            time.sleep(0.6)
            stop.set()
            for t in threads:
                t.join(timeout=15)
            assert not failures, failures  # accounting never fails a client request
            assert during["flush_errors"] >= 1 and during["buffered"] > 0
            assert unreadable.status_code == 503, unreadable.text
            assert unreadable.json()["error"]["code"] == "ledger_unavailable"
            # the first read after the restart already succeeds: stale pooled connections are retried
            wait_for_totals(gateway, sent)
            assert len(sent.usage) > 20
            assert httpx.get(gateway + "/ready").json()["ledger"]["dropped"] == 0
