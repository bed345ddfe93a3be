"""The published shape of H100 vs MI300X, measured through the simulator's own HTTP API.

Every figure is read from `/metrics` (simulated seconds), with the clock running `SCALE` times faster
than real time so a batch of 256 decodes in a fraction of a second.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from backends.sim.app import RunningServer, start_server
from backends.sim.options import SimOptions
from backends.sim.profiles import build_hardware

# measures time or capacity on the whole machine: `make test` runs it by itself (pyproject.toml)
pytestmark = pytest.mark.alone

MODEL = "llama-3.1-8b"
SCALE = 200.0  # the engine loop may fall behind real time at this pace; its timeline stays exact
PROMPT = " ".join(f"w{i}" for i in range(100))  # 100 tokens
OUTPUT = 400  # long enough that the steady decode dominates: mean context about 300 tokens


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not exposed"
    return float(match.group(1))


@asynccontextmanager
async def backend(
    gpu: str, *, scale: float = SCALE, max_model_len: int = 8192, **overrides: float
) -> AsyncIterator[tuple[RunningServer, httpx.AsyncClient]]:
    options = SimOptions(
        models=(MODEL,),
        max_model_len=max_model_len,
        hardware=build_hardware(gpu, MODEL, 1, overrides),
        time_scale=scale,
    )
    server = await start_server(options)
    limits = httpx.Limits(max_connections=400, max_keepalive_connections=400)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, limits=limits, timeout=60) as http:
            yield server, http
    finally:
        await server.close()


async def mean_tpot(gpu: str, batch: int) -> float:
    """Mean time per output token of a batch of `batch` sequences decoding together (simulated seconds).

    The batch is one request with `n=batch` choices, which the engine runs as `batch` sequences sharing
    the prompt, admitted in the same step, so the batch is exactly `batch` for the whole decode however
    fast the clock runs (separate requests would trickle in over real time).
    """
    async with backend(gpu) as (_, http):
        body = {"prompt": PROMPT, "max_tokens": OUTPUT, "n": batch}
        response = await http.post("/v1/completions", json=body)
        assert response.status_code == 200
        assert response.json()["usage"]["completion_tokens"] == batch * OUTPUT
        text = (await http.get("/metrics")).text
    count = metric(text, "vllm:request_time_per_output_token_seconds_count")
    assert count == batch
    return metric(text, "vllm:request_time_per_output_token_seconds_sum") / count


@pytest.fixture(scope="module")
def tpot() -> Callable[[int], Awaitable[tuple[float, float]]]:
    cache: dict[int, tuple[float, float]] = {}

    async def measure(batch: int) -> tuple[float, float]:
        if batch not in cache:
            cache[batch] = (await mean_tpot("h100-sxm5", batch), await mean_tpot("mi300x", batch))
        return cache[batch]

    return measure


async def test_batch_1_h100_tpot_20_to_30_percent_lower(
    tpot: Callable[[int], Awaitable[tuple[float, float]]],
) -> None:
    h100, mi300x = await tpot(1)
    assert 0.20 <= 1 - h100 / mi300x <= 0.30, (h100, mi300x)


@pytest.mark.parametrize("batch", [64, 128])
async def test_batch_64_to_128_gap_5_to_10_percent(
    tpot: Callable[[int], Awaitable[tuple[float, float]]], batch: int
) -> None:
    h100, mi300x = await tpot(batch)
    assert 0.05 <= 1 - h100 / mi300x <= 0.10, (h100, mi300x)


async def test_batch_256_mi300x_throughput_higher(
    tpot: Callable[[int], Awaitable[tuple[float, float]]],
) -> None:
    h100, mi300x = await tpot(256)
    assert mi300x < h100, (h100, mi300x)  # same batch, so tokens/s = batch / TPOT


async def admitted_before_queueing(gpu: str, prompt_tokens: int = 32_000) -> int:
    """Send long prompts at once; how many run once the KV cache cannot take another and the rest wait."""
    async with backend(gpu, scale=50, max_model_len=prompt_tokens + 768) as (_, http):
        tasks = [
            asyncio.create_task(
                http.post(
                    "/v1/completions", json={"prompt": [i, *([7] * (prompt_tokens - 1))], "max_tokens": 700}
                )
            )
            for i in range(48)
        ]
        try:
            for _ in range(500):
                await asyncio.sleep(0.02)
                text = (await http.get("/metrics")).text
                blocks = int(re.search(r'num_gpu_blocks="(\d+)"', text).group(1))  # type: ignore[union-attr]
                free = (1 - metric(text, "vllm:kv_cache_usage_perc")) * blocks
                if metric(text, "vllm:num_requests_waiting") > 0 and free < prompt_tokens / 16:
                    return int(metric(text, "vllm:num_requests_running"))
            raise AssertionError("the KV cache never filled up")
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


async def test_mi300x_admits_about_2_8x_the_long_sequences_of_h100() -> None:
    h100, mi300x = await admitted_before_queueing("h100-sxm5"), await admitted_before_queueing("mi300x")
    assert h100 >= 10 and 2.6 <= mi300x / h100 <= 3.0, (h100, mi300x)
