"""parse_engine_load on vLLM's Prometheus text, and MetricsScraper against a real HTTP server."""

from __future__ import annotations

import socket

import aiohttp
import pytest
from aiohttp import web

from backends.models import Backend, BackendConfig, EngineLoad, PoolConfig, build_backends
from backends.scraper import MetricsScraper, parse_engine_load
from tests.support import serving

VLLM = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 7.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4375
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="Qwen/Qwen3-8B"} 12.5
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="Qwen/Qwen3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen3-8B"} 90.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="Qwen/Qwen3-8B"} 90.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen3-8B"} 2.0
# HELP process_resident_memory_bytes Resident memory size in bytes.
# TYPE process_resident_memory_bytes gauge
process_resident_memory_bytes 1.2e+09
"""


def test_parse_real_vllm_text():
    load = parse_engine_load(VLLM)
    assert load is not None
    assert (load.running, load.waiting, load.kv_cache_usage) == (7.0, 3.0, 0.4375)
    assert load.scraped_at is not None


def test_parse_old_gpu_cache_usage_name_without_labels():
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        "vllm:gpu_cache_usage_perc 0.25\n"
        "vllm:num_requests_running 2\n"
        "vllm:num_requests_waiting 0\n"
    )
    load = parse_engine_load(text)
    assert load is not None
    assert (load.running, load.waiting, load.kv_cache_usage) == (2.0, 0.0, 0.25)


def test_several_series_are_summed_usage_takes_the_max():
    text = (
        'vllm:num_requests_running{engine="0",model_name="a"} 3\n'
        'vllm:num_requests_running{engine="1",model_name="a"} 4\n'
        'vllm:num_requests_waiting{engine="0",model_name="a"} 1\n'
        'vllm:num_requests_waiting{engine="1",model_name="a"} 2\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.3\n'
        'vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.8\n'
        'vllm:gpu_cache_usage_perc{engine="1",model_name="a"} 0.5\n'
    )
    load = parse_engine_load(text)
    assert load is not None
    assert (load.running, load.waiting, load.kv_cache_usage) == (7.0, 3.0, 0.8)


def test_not_vllm_is_none():
    text = (
        "# HELP process_cpu_seconds_total Total user and system CPU time.\n"
        "# TYPE process_cpu_seconds_total counter\n"
        "process_cpu_seconds_total 3.2\n"
        'http_requests_total{code="200"} 10\n'
    )
    assert parse_engine_load(text) is None
    assert parse_engine_load("") is None
    # only vLLM metrics that routing does not use
    assert parse_engine_load('vllm:num_preemptions_total{engine="0"} 2.0\n') is None


def test_malformed_values_are_skipped():
    text = (
        'vllm:num_requests_running{engine="0"} NaNope\n'
        'vllm:num_requests_running{engine="1"} 5\n'
        "vllm:num_requests_waiting\n"
        'vllm:num_requests_waiting{engine="0"} 2\n'
        'vllm:kv_cache_usage_perc{engine="0"} zero\n'
    )
    load = parse_engine_load(text)
    assert load is not None
    assert (load.running, load.waiting, load.kv_cache_usage) == (5.0, 2.0, 0.0)


def test_only_malformed_is_none():
    assert parse_engine_load('vllm:num_requests_running{engine="0"} oops\n') is None


# --- MetricsScraper against a real server -------------------------------------------------------------


def _backends(*urls: str) -> list[Backend]:
    pool = PoolConfig(
        name="p",
        vendor="amd",
        accelerator="mi300x",
        price_per_gpu_hour=1.0,
        backends=[BackendConfig(url=u, models=["m"], max_model_len=4096) for u in urls],
    )
    return build_backends([pool])


@pytest.fixture
async def server():
    """A /metrics server on 127.0.0.1:0 whose body and status a test can change."""
    state = {"status": 200, "body": VLLM, "auth": []}

    async def metrics(request: web.Request) -> web.Response:
        state["auth"].append(request.headers.get("Authorization"))
        return web.Response(status=state["status"], text=state["body"])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with serving(app) as url:
        state["url"] = url
        yield state


def _unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_scrape_all_updates_load(server):
    (backend,) = _backends(server["url"])
    async with aiohttp.ClientSession() as session:
        await MetricsScraper(session, [backend], interval=60, timeout=2).scrape_all()
    assert (backend.load.running, backend.load.waiting, backend.load.kv_cache_usage) == (7.0, 3.0, 0.4375)
    assert backend.load.scraped_at is not None
    assert server["auth"] == [None]


async def test_error_status_and_non_vllm_keep_previous_load(server):
    (backend,) = _backends(server["url"])
    previous = EngineLoad(running=1, waiting=2, kv_cache_usage=0.5, scraped_at=123.0)
    backend.load = previous
    async with aiohttp.ClientSession() as session:
        scraper = MetricsScraper(session, [backend], interval=60, timeout=2)
        server["status"] = 500
        await scraper.scrape_all()
        assert backend.load is previous
        server["status"], server["body"] = 200, "process_cpu_seconds_total 1\n"
        await scraper.scrape_all()
        assert backend.load is previous
        server["body"] = VLLM
        await scraper.scrape_all()
        assert backend.load is not previous and backend.load.running == 7.0
    assert len(server["auth"]) == 3


async def test_unreachable_backend_keeps_previous_load_others_updated(server):
    dead, alive = _backends(f"http://127.0.0.1:{_unused_port()}", server["url"])
    previous = EngineLoad(running=9, waiting=9, kv_cache_usage=0.9, scraped_at=1.0)
    dead.load = previous
    async with aiohttp.ClientSession() as session:
        await MetricsScraper(session, [dead, alive], interval=60, timeout=2).scrape_all()
    assert dead.load is previous
    assert alive.load.running == 7.0


async def test_api_key_is_sent(server):
    (backend,) = _backends(server["url"])
    backend.api_key = "sk-backend"
    async with aiohttp.ClientSession() as session:
        await MetricsScraper(session, [backend], interval=60, timeout=2).scrape_all()
    assert server["auth"] == ["Bearer sk-backend"]
