"""Fault injection: every fault observable over HTTP, settable at run time, and reversible."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from backends.sim.app import RunningServer, start_server
from backends.sim.faults import Faults
from backends.sim.options import SimOptions

MODEL = "llama-3.1-8b"
BODY = {"prompt": "hello", "max_tokens": 20}


@pytest.fixture
async def sim() -> AsyncIterator[RunningServer]:
    server = await start_server(SimOptions(models=(MODEL,), ttft_ms=10, tpot_ms=2, time_scale=10))
    yield server
    await server.close()


@pytest.fixture
async def http(sim: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False, timeout=5) as http:
        yield http


async def set_faults(http: httpx.AsyncClient, **fields: object) -> dict[str, object]:
    response = await http.post("/sim/faults", json=fields)
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_error_rate_and_status_then_off(http: httpx.AsyncClient) -> None:
    assert (await http.get("/sim/faults")).json()["error_rate"] == 0
    state = await set_faults(http, error_rate=0.3, error_status=503)
    assert state["error_rate"] == 0.3 and state["error_status"] == 503
    statuses = [(await http.post("/v1/completions", json=BODY)).status_code for _ in range(60)]
    failed = statuses.count(503)
    assert set(statuses) == {200, 503} and 8 <= failed <= 32
    await set_faults(http, error_rate=1, error_status=429)
    limited = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]})
    assert limited.status_code == 429 and limited.headers["retry-after"] == "1"
    assert limited.json()["error"]["type"] == "TooManyRequestsError"
    assert (await http.get("/health")).status_code == 200  # health checks are never faulted
    await set_faults(http, error_rate=0)
    assert (await http.post("/v1/completions", json=BODY)).status_code == 200


async def test_added_latency_then_off(http: httpx.AsyncClient) -> None:
    await set_faults(http, added_latency_ms=2000)  # simulated: 0.2 s of real time at scale 10
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})).status_code == 200
    assert loop.time() - started >= 0.2
    await set_faults(http, added_latency_ms=0)
    started = loop.time()
    await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 1})
    assert loop.time() - started < 0.15


async def test_hang_then_off(http: httpx.AsyncClient, sim: RunningServer) -> None:
    await set_faults(http, hang=True)
    with pytest.raises(httpx.ReadTimeout):
        await http.post("/v1/completions", json=BODY, timeout=0.3)
    assert (await http.get("/metrics")).status_code == 200
    await set_faults(http, hang=False)
    assert (await http.post("/v1/completions", json=BODY)).status_code == 200


async def test_die_mid_stream_then_off(http: httpx.AsyncClient, sim: RunningServer) -> None:
    await set_faults(http, die_after_tokens=5)
    events = 0
    with pytest.raises(httpx.RemoteProtocolError):
        async with http.stream("POST", "/v1/completions", json={**BODY, "stream": True}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                events += line.startswith("data: ")
    assert events == 5  # five tokens, then the connection was cut without [DONE]
    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/v1/completions", json=BODY)  # non-streaming: no answer at all
    await set_faults(http, die_after_tokens=None)
    streamed = await http.post("/v1/completions", json={**BODY, "stream": True})
    assert streamed.text.endswith("data: [DONE]\n\n")
    for _ in range(100):
        if not sim.stats.running:
            break
        await asyncio.sleep(0.01)
    assert sim.stats.finished["abort"] == 2 and sim.stats.running == 0


async def test_refuse_connections_then_resume(sim: RunningServer) -> None:
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False, timeout=2) as control:
        state = await set_faults(control, refuse_connections_s=100)  # simulated: 10 s real at scale 10
        assert state["refusing_connections"] is True
        async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as fresh:
            with pytest.raises(httpx.ConnectError):
                await fresh.get("/health")
        # the control connection was open before the refusal, so it still reaches the server
        assert (await set_faults(control, refuse_connections_s=0))["refusing_connections"] is False
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as fresh:
        assert (await fresh.get("/health")).status_code == 200
        await set_faults(fresh, refuse_connections_s=1)  # 0.1 s real, then it listens again by itself
    await asyncio.sleep(0.3)
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False) as fresh:
        faults = (await fresh.get("/sim/faults")).json()
        assert faults["refusing_connections"] is False and faults["refuse_connections_s"] is None


async def test_faults_at_start_reset_and_validation() -> None:
    options = SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=1, faults=Faults(error_rate=1, error_status=500))
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            assert (await http.post("/v1/completions", json=BODY)).status_code == 500
            assert (await http.post("/v1/embeddings", json={"input": "x"})).status_code == 500
            bad = await http.post("/sim/faults", json={"error_rate": 2})
            assert bad.status_code == 400 and "error_rate" in bad.json()["error"]["message"]
            assert (await http.post("/sim/faults", json={"bogus": 1})).status_code == 400
            state = await set_faults(http, reset=True)
            assert state["error_rate"] == 0 and state["hang"] is False
            assert (await http.post("/v1/completions", json=BODY)).status_code == 200
    finally:
        await server.close()
