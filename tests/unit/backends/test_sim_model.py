"""The performance model: profiles, KV geometry, prefix caching, queueing and the time scale."""

from __future__ import annotations

import asyncio
import re
import time

import httpx
import pytest

from backends.sim.__main__ import main as sim_main
from backends.sim.app import start_server
from backends.sim.kvcache import BlockPool, Holding, block_hashes
from backends.sim.metrics import EngineStats
from backends.sim.options import SimOptions
from backends.sim.profiles import ProfileError, build_hardware
from backends.sim.scheduler import Group, Scheduler

MODEL = "llama-3.1-8b"


def metric(text: str, name: str) -> float:
    match = re.search(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE)
    assert match, f"{name} not exposed"
    return float(match.group(1))


def test_kv_capacity_follows_memory() -> None:
    h100, mi300x = build_hardware("h100-sxm5", MODEL), build_hardware("mi300x", MODEL)
    assert h100.model.kv_bytes_per_token == 128 * 1024
    assert 400_000 <= h100.kv_capacity_tokens <= 470_000
    assert 1_150_000 <= mi300x.kv_capacity_tokens <= 1_300_000
    assert 2.7 <= mi300x.kv_capacity_tokens / h100.kv_capacity_tokens <= 2.9
    assert build_hardware("mi300x", "llama-3.1-70b").model.kv_bytes_per_token == 320 * 1024
    assert build_hardware("h100-sxm5", "llama-3.1-70b", gpus=2).kv_capacity_tokens > 16_000
    assert build_hardware("mi300x", "llama-3.1-70b").kv_capacity_tokens > 100_000


def test_70b_on_one_h100_is_refused_at_start(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ProfileError, match=r"llama-3\.1-70b on 1x h100-sxm5 does not fit"):
        build_hardware("h100-sxm5", "llama-3.1-70b")
    argv = ["--gpu", "h100-sxm5", "--model", "meta-llama/Llama-3.1-70B-Instruct", "--port", "0"]
    assert sim_main(argv) == 2
    assert "does not fit" in capsys.readouterr().err


def test_overrides_by_short_or_full_name() -> None:
    hardware = build_hardware("h100-sxm5", MODEL, overrides={"memory_gib": 160, "engine.max_num_seqs": 32})
    assert hardware.gpu.memory_gib == 160 and hardware.limits.max_num_seqs == 32
    assert build_hardware("mi300x", MODEL, overrides={"bw_eff.half": 8}).gpu.bw_eff.half == 8
    model = build_hardware("mi300x", MODEL, overrides={"kv_heads": 4, "model.layers": 2}).model
    assert (model.kv_heads, model.layers, model.name) == (4, 2, build_hardware("mi300x", MODEL).model.name)
    with pytest.raises(ProfileError, match="unknown profile override `warp_speed`"):
        build_hardware("mi300x", MODEL, overrides={"warp_speed": 9})
    with pytest.raises(ProfileError, match="unknown GPU profile"):
        build_hardware("tpu", MODEL)


def test_block_pool_shares_caches_and_evicts() -> None:
    pool = BlockPool(num_blocks=4, block_size=2)
    hashes = block_hashes("a b c d e", 5, 2)
    assert len(hashes) == 2 and hashes == block_hashes("a b c d x y", 6, 2)[:2]
    first = Holding()
    assert pool.acquire(first, [], 3)
    pool.register(first, hashes)
    assert (len(first.shared), first.private, pool.used) == (2, 1, 3)
    second = Holding()
    assert pool.cached_prefix(hashes, 2) == 2 and pool.acquire(second, hashes, 1)
    assert pool.used == 4 and not pool.acquire(Holding(), [], 1)
    pool.release(first)
    pool.release(second)
    assert pool.used == 0 and pool.cached_prefix(hashes, 2) == 2  # freed but still cached
    assert pool.acquire(Holding(), [], 4) and pool.cached_prefix(hashes, 2) == 0  # evicted for space


def test_scheduler_queues_then_preempts_when_kv_runs_out() -> None:
    limits = build_hardware("h100-sxm5", MODEL, overrides={"block_size": 4}).limits
    stats = EngineStats(model_name=MODEL, kv_capacity_tokens=0)
    scheduler = Scheduler(limits, num_blocks=10, stats=stats)
    groups = [Group(16, [], [12], ["length"], arrival=0.0) for _ in range(3)]
    for group in groups:
        scheduler.add(group)
    scheduler.apply(scheduler.plan(0.0), 0.01)
    assert (stats.running, stats.waiting) == (2, 1)  # 2 x 4 blocks of prompt; the third waits
    for step in range(1, 30):
        scheduler.apply(scheduler.plan(step), step + 0.01)
        assert scheduler.pool.used <= 10
    assert stats.preemptions >= 1
    while scheduler.has_work():
        scheduler.apply(scheduler.plan(0.0), 0.0)
    assert stats.finished["length"] == 3 and stats.generation_tokens == 36 and scheduler.pool.used == 0


async def ttft(http: httpx.AsyncClient, prompt: str) -> float:
    """TTFT of one request alone, read from the TTFT histogram (simulated seconds)."""
    before = metric((await http.get("/metrics")).text, "vllm:time_to_first_token_seconds_sum")
    response = await http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert response.status_code == 200
    return metric((await http.get("/metrics")).text, "vllm:time_to_first_token_seconds_sum") - before


async def test_ttft_grows_with_prompt_and_queue_and_prefix_hits_cut_it() -> None:
    options = SimOptions(
        models=(MODEL,), max_model_len=32768, hardware=build_hardware("mi300x", MODEL), time_scale=100
    )
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as http:
            lengths = [64, 1024, 8000, 24000]
            times = [await ttft(http, " ".join(f"p{n}x{i}" for i in range(n))) for n in lengths]
            assert times == sorted(times) and times[-1] > 20 * times[0], times

            shared = " ".join(f"doc{i}" for i in range(8000))
            cold = await ttft(http, shared + " first question")
            hits_before = metric((await http.get("/metrics")).text, "vllm:prefix_cache_hits_total")
            warm = await ttft(http, shared + " second question")
            text = (await http.get("/metrics")).text
            assert metric(text, "vllm:prefix_cache_hits_total") - hits_before >= 7900
            assert warm < cold / 5, (cold, warm)

            info = (await http.get("/sim/info")).json()
            assert (
                info["gpu"] == "mi300x"
                and info["num_blocks"] * info["block_size"] == info["kv_capacity_tokens"]
            )
            assert f'num_gpu_blocks="{info["num_blocks"]}"' in text and 'block_size="16"' in text
    finally:
        await server.close()


async def test_ttft_grows_with_queueing() -> None:
    # a slower clock than elsewhere: concurrent requests must reach the engine before it finishes the first
    options = SimOptions(models=(MODEL,), hardware=build_hardware("h100-sxm5", MODEL), time_scale=5)
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as http:
            alone = await ttft(http, " ".join(f"z{i}" for i in range(6000)))
            before = (await http.get("/metrics")).text
            prompts = [" ".join(f"q{j}w{i}" for i in range(6000)) for j in range(6)]
            bodies = [{"prompt": p, "max_tokens": 2} for p in prompts]
            await asyncio.gather(*(http.post("/v1/completions", json=b) for b in bodies))
            after = (await http.get("/metrics")).text

        def delta(name: str) -> float:
            return metric(after, name) - metric(before, name)

        assert delta("vllm:request_queue_time_seconds_sum") > 0
        together = delta("vllm:time_to_first_token_seconds_sum") / len(prompts)
        assert together > 1.5 * alone, (alone, together)
    finally:
        await server.close()


async def measure_tpot(scale: float) -> tuple[float, float]:
    """(simulated TPOT from /metrics, real seconds taken) for one 40-token request."""
    options = SimOptions(models=(MODEL,), hardware=build_hardware("h100-sxm5", MODEL), time_scale=scale)
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            started = time.monotonic()
            body = {"prompt": "hello there", "max_tokens": 40, "stream": True}
            response = await http.post("/v1/completions", json=body)
            elapsed = time.monotonic() - started
            assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
            text = (await http.get("/metrics")).text
        return metric(text, "vllm:request_time_per_output_token_seconds_sum"), elapsed
    finally:
        await server.close()


async def test_time_scale_speeds_the_clock_not_the_figures() -> None:
    slow_tpot, slow_real = await measure_tpot(1)
    fast_tpot, fast_real = await measure_tpot(20)
    assert 0.005 < slow_tpot < 0.01 and fast_tpot == pytest.approx(slow_tpot, rel=0.02)
    assert slow_real > 0.25 and fast_real < slow_real / 4


async def test_idle_engine_does_not_spin() -> None:
    options = SimOptions(models=(MODEL,), hardware=build_hardware("h100-sxm5", MODEL), time_scale=10)
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False) as http:
            await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
            cpu = time.process_time()
            await asyncio.sleep(0.3)
            assert time.process_time() - cpu < 0.05
            assert metric((await http.get("/metrics")).text, "vllm:num_requests_running") == 0
    finally:
        await server.close()
