"""Backends fail; clients should not notice: the gateway under SDK load on a simulated fleet with faults.

One fleet (2x H100 + 2x MI300X, fixed timing) serves the module; each test starts its own gateway and
resets the faults it injected. The kill test has its own fleet, since it SIGKILLs one backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from backends.lifetime import die_with_parent
from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from loadtest.bench import failover as bench
from tests.support import ROOT, free_port, running_gateway

MODEL = bench.MODEL
GATEWAY = {
    "timeouts": {"connect": 0.5, "first_byte": 0.6, "between_chunks": 2.0},
    "health": {"interval": 0.2, "timeout": 0.2},
    "breaker": {"failure_threshold": 3, "open_s": 0.5, "close_after": 2},
    "shutdown_grace": 5,
}
SHORT = [{"role": "user", "content": "What is a KV cache?"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(parse_fleet_spec(bench.FLEET, "<reliability>"), log_dir=tmp_path_factory.mktemp("f")) as f:
        yield f


def faults(fleet: Fleet, name: str, **changes: Any) -> None:
    url = next(b.url for b in fleet.backends if b.name == name)
    httpx.post(url + "/sim/faults", json=changes, timeout=5).raise_for_status()


@contextlib.contextmanager
def cleared(fleet: Fleet) -> Iterator[None]:
    """Reset every backend's faults afterwards (waiting out a refusal, which cannot be reset remotely)."""
    try:
        yield
    finally:
        for backend in fleet.backends:
            deadline = time.monotonic() + 10
            while True:
                try:
                    faults(fleet, backend.name, reset=True)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, f"{backend.name} still refuses connections"
                    time.sleep(0.1)


def gateway_config(fleet: Fleet, workdir: Path, policy: str = bench.SPREAD) -> dict[str, Any]:
    config = fleet.gateway_config(**GATEWAY)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "policy.yaml").write_text(policy)
    config["policy"] = {"file": str(workdir / "policy.yaml")}
    return config


def backends(base: str) -> dict[str, dict[str, Any]]:
    return {b["name"]: b for b in httpx.get(base + "/admin/v1/backends", timeout=5).json()["data"]}


def wait_until(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def assert_ledger_matches(base: str, outcomes: list[bench.Outcome]) -> None:
    expected = bench.client_totals(outcomes)
    ledger = bench.wait_for_ledger(base, expected["requests"])
    assert ledger["requests"] == expected["requests"]
    assert ledger["completion_tokens"] == expected["completion_tokens"]
    assert ledger["errors"] == expected["errors"]
    if expected["errors"] == 0:
        assert ledger["prompt_tokens"] == expected["prompt_tokens_complete"]


def test_one_backend_of_four_killed_mid_run(tmp_path: Path) -> None:
    summary = bench.run(requests=240, concurrency=12, kill_at=0.33, workdir=tmp_path)
    outcomes = summary["outcomes"]
    assert summary["requests"] == 240
    assert summary["failed_before_streaming"] == 0, [o.error for o in outcomes if not o.ok]
    assert all(o.ok or o.started for o in outcomes)
    assert summary["ledger_matches_clients"]
    assert summary["killed_backend"] in ("open", "half-open")


def test_hanging_backend_is_left_after_the_first_byte_timeout(fleet: Fleet, tmp_path: Path) -> None:
    with cleared(fleet), running_gateway(gateway_config(fleet, tmp_path), tmp_path) as base:
        faults(fleet, "mi300x-0", hang=True)
        outcomes = asyncio.run(bench.drive(base, 40, 8, max_tokens=8))
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        moved = [o for o in outcomes if o.attempts > 1]
        assert moved and all(o.seconds >= GATEWAY["timeouts"]["first_byte"] for o in moved)
        assert all(o.backend != "mi300x-0" for o in outcomes)
        state = backends(base)["mi300x-0"]
        assert state["breaker_opened"] >= 1 or state["breaker_failures"] >= 1
        assert_ledger_matches(base, outcomes)


def test_breaker_opens_on_503s_then_half_opens_and_recovers(fleet: Fleet, tmp_path: Path) -> None:
    with cleared(fleet), running_gateway(gateway_config(fleet, tmp_path), tmp_path) as base:
        faults(fleet, "h100-0", error_rate=1.0, error_status=503)
        outcomes = asyncio.run(bench.drive(base, 30, 6, max_tokens=8))
        assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
        state = backends(base)["h100-0"]
        assert state["breaker_opened"] >= 1 and state["healthy"], "live traffic, not /health, opened it"
        faults(fleet, "h100-0", reset=True)
        # No traffic: after open_s the breaker lets probes through by itself.
        wait_until(lambda: backends(base)["h100-0"]["breaker"] == "half-open", "never half-opened")
        assert backends(base)["h100-0"]["routable"]
        # A half-open backend takes one probe at a time, and only when the policy picks it, so how many
        # requests it takes to see `close_after` successes depends on routing: keep the traffic coming.
        more: list[Any] = []
        for _ in range(8):
            more += asyncio.run(bench.drive(base, 24, 4, max_tokens=8))
            if backends(base)["h100-0"]["breaker"] == "closed":
                break
        assert all(o.ok for o in more)
        assert backends(base)["h100-0"]["breaker"] == "closed"
        assert any(o.backend == "h100-0" for o in more), "the recovered backend gets traffic again"
        assert_ledger_matches(base, outcomes + more)


NVIDIA_FIRST = "routes:\n  default:\n    prefer: {vendor: nvidia}\n    fallback: {vendor: amd}\n"
NVIDIA_ONLY = "routes:\n  default:\n    prefer: {vendor: nvidia}\n"


def _nvidia_down(config: dict[str, Any]) -> dict[str, Any]:
    """The whole NVIDIA pool down for as long as the test takes: its backends point at closed ports (a
    simulated refusal lasts a fixed few seconds, which a slow machine can outlast before traffic starts)."""
    for pool in config["pools"]:
        if pool["vendor"] == "nvidia":
            for backend in pool["backends"]:
                backend["url"] = f"http://127.0.0.1:{free_port()}"
    return config


def test_preferred_pool_down_spills_where_allowed_and_503_where_not(fleet: Fleet, tmp_path: Path) -> None:
    config = _nvidia_down(gateway_config(fleet, tmp_path / "a", NVIDIA_FIRST))
    with running_gateway(config, tmp_path / "a") as base:
        outcomes = asyncio.run(bench.drive(base, 30, 6, max_tokens=8))
        assert all(o.ok for o in outcomes)
        assert {o.backend for o in outcomes} <= {"mi300x-0", "mi300x-1"}
        assert_ledger_matches(base, outcomes)
    config = _nvidia_down(gateway_config(fleet, tmp_path / "b", NVIDIA_ONLY))
    with running_gateway(config, tmp_path / "b") as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
        with pytest.raises(openai.InternalServerError) as caught:
            client.chat.completions.create(model=MODEL, messages=SHORT, max_tokens=4)  # type: ignore[arg-type]
        assert caught.value.status_code == 503
        assert "failed its health check" in caught.value.message


async def _open_streams(base: str, count: int, max_tokens: int) -> tuple[openai.AsyncOpenAI, list[Any]]:
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
    opened = []
    for _ in range(count):
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=SHORT,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            stream=True,
            stream_options={"include_usage": True},
        )
        stream = raw.parse()
        iterator = stream.__aiter__()
        await iterator.__anext__()  # the first chunk has reached the client
        opened.append((raw.headers["x-switchyard-backend"], iterator))
    return client, opened


async def _finish(iterator: Any) -> tuple[int, Any]:
    tokens, usage = 0, None
    async for chunk in iterator:
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
        usage = chunk.usage or usage
    return tokens, usage


def test_drain_and_undrain_lose_no_in_flight_request(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(gateway_config(fleet, tmp_path), tmp_path) as base:

        async def scenario() -> None:
            client, opened = await _open_streams(base, 4, max_tokens=300)
            target = opened[0][0]
            async with httpx.AsyncClient() as admin:
                state = (await admin.post(f"{base}/admin/v1/backends/{target}/drain")).json()
            assert state["draining"] and not state["routable"] and state["inflight"] >= 1
            after = await bench.drive(base, 16, 4, max_tokens=4)
            assert all(o.ok and o.backend != target for o in after)
            for _, iterator in opened:
                tokens, usage = await _finish(iterator)
                assert usage is not None and usage.completion_tokens == 300 == tokens
            await client.close()
            assert backends(base)[target]["inflight"] == 0
            cli = [sys.executable, "-m", "gateway.cli", "backends", "undrain", target, "--url", base]
            done = await asyncio.to_thread(
                subprocess.run, cli, cwd=ROOT, capture_output=True, text=True, timeout=20
            )
            assert done.returncode == 0, done.stderr
            assert target in done.stdout and "false" in done.stdout
            assert backends(base)[target]["routable"]

        asyncio.run(scenario())


def test_graceful_shutdown_lets_streams_finish(fleet: Fleet, tmp_path: Path) -> None:
    port = free_port()
    config = gateway_config(fleet, tmp_path)
    config["gateway"]["port"] = port
    (tmp_path / "gateway.yaml").write_text(yaml.safe_dump(config))
    log = (tmp_path / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(tmp_path / "gateway.yaml")],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _up(base), "gateway did not start", timeout=30)

        async def scenario() -> None:
            client, opened = await _open_streams(base, 4, max_tokens=300)
            os.kill(process.pid, signal.SIGTERM)
            await asyncio.sleep(0.2)
            assert not _up(base), "a stopping gateway accepts no new connections"
            results = await asyncio.gather(*(_finish(it) for _, it in opened))
            for tokens, usage in results:
                assert usage is not None and usage.completion_tokens == 300 == tokens
            await client.close()

        asyncio.run(scenario())
        assert process.wait(timeout=10) in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it handled
        text = (tmp_path / "gateway.log").read_text()
        assert "Application shutdown complete" in text and "graceful shutdown exceeded" not in text
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _up(base: str) -> bool:
    try:
        return httpx.get(base + "/health", timeout=0.5).status_code == 200
    except httpx.HTTPError:
        return False


def test_stream_cut_after_first_byte_ends_with_error_and_is_accounted(fleet: Fleet, tmp_path: Path) -> None:
    with cleared(fleet), running_gateway(gateway_config(fleet, tmp_path), tmp_path) as base:
        for backend in fleet.backends:
            faults(fleet, backend.name, die_after_tokens=5)

        async def streams() -> list[bench.Outcome]:
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
            try:
                return [await bench.one(client, i, True, 40) for i in range(6)]
            finally:
                await client.close()

        outcomes = asyncio.run(streams())
        assert all(not o.ok and o.started and o.received == 5 for o in outcomes)
        assert all("failed" in (o.error or "") for o in outcomes)
        assert_ledger_matches(base, outcomes)


BACKPRESSURE = """
routes:
  default:
    prefer: any
    saturation: {max_inflight: 1}
    backpressure: {max_queued: 2, max_wait_ms: 150, retry_after_s: 2}
"""


def test_backpressure_queues_briefly_then_429_with_retry_after(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(gateway_config(fleet, tmp_path, BACKPRESSURE), tmp_path) as base:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=10) as client:
                body = {"model": MODEL, "messages": SHORT, "max_tokens": 200}
                return await asyncio.gather(
                    *(client.post(base + "/v1/chat/completions", json=body) for _ in range(12))
                )

        replies = asyncio.run(burst())
        ok = [r for r in replies if r.status_code == 200]
        refused = [r for r in replies if r.status_code == 429]
        assert len(ok) + len(refused) == 12
        assert 4 <= len(ok) <= 6, [r.json() for r in refused]
        assert refused and all(r.headers["retry-after"] == "2" for r in refused)
        assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
        queue = httpx.get(base + "/admin/v1/backends").json()["queues"]["default"]
        assert queue["refused"] >= 1 and queue["waiting"] == 0
        ledger = bench.wait_for_ledger(base, len(ok))
        assert ledger["requests"] == len(ok)
        assert ledger["completion_tokens"] == sum(r.json()["usage"]["completion_tokens"] for r in ok)


def test_a_request_that_waited_for_room_logs_how_long(fleet: Fleet, tmp_path: Path) -> None:
    """The access log's `queued_s`: a replay (loadtest/whatif) needs when a held request arrived."""
    config = gateway_config(fleet, tmp_path, BACKPRESSURE.replace("max_wait_ms: 150", "max_wait_ms: 5000"))
    access_log = tmp_path / "access.jsonl"
    config["telemetry"] = {"access_log": {"destination": str(access_log)}}
    with running_gateway(config, tmp_path) as base:

        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=10) as client:
                body = {"model": MODEL, "messages": SHORT, "max_tokens": 4}
                return await asyncio.gather(
                    *(client.post(base + "/v1/chat/completions", json=body) for _ in range(6))
                )

        replies = asyncio.run(burst())
        assert [r.status_code for r in replies] == [200] * 6
    lines = [json.loads(line) for line in access_log.read_text().splitlines()]
    waited = [line["queued_s"] for line in lines if "queued_s" in line]
    assert len(lines) == 6 and 1 <= len(waited) <= 4, lines  # at most 2 waited in the queue at once
    assert all(0 < q < 5 for q in waited), waited
