"""Issue 15, item 6: a non-streaming client that leaves cancels its backend request, and the ledger says
it left (status 499), through the openai SDK against a slow simulated backend."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import openai
import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import metric, running_gateway, sim_metrics

MODEL = "llama-3.1-8b"
SLOW_FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.90, ttft_ms: 5,
      tpot_ms: 10}}
"""


def test_a_non_streaming_client_that_leaves_cancels_the_backend_request(tmp_path: Path) -> None:
    with Fleet(parse_fleet_spec(SLOW_FLEET, "<slow>"), log_dir=tmp_path / "fleet") as fleet:
        sim = fleet.backends[0].url
        config = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
        config["ledger"] = {"store": "memory", "flush_interval": 0.05}
        with running_gateway(config, tmp_path / "gw") as base:
            client = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=1.0)
            left_at = time.monotonic()
            with pytest.raises(openai.APITimeoutError):  # 1,500 tokens at 10 ms each: about 15 s
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": "write a long story"}],
                    max_tokens=1500,
                )
            deadline = time.monotonic() + 5
            while metric(sim_metrics(sim), "vllm:num_requests_running") > 0:
                assert time.monotonic() < deadline, "the backend kept generating for a client that left"
                time.sleep(0.05)
            stopped_after = time.monotonic() - left_at
            assert stopped_after < 4, stopped_after
            assert metric(sim_metrics(sim), "vllm:request_success_total", finished_reason="abort") == 1
            records: list[dict[str, object]] = []
            while not records:
                assert time.monotonic() < deadline, "no ledger record for the request whose client left"
                records = httpx.get(base + "/admin/v1/requests").json()["data"]
                time.sleep(0.05)
            (record,) = records
            assert record["status"] == 499
            assert record["completion_tokens"] == 0
            assert record["prompt_tokens"] > 0  # counted by the backend's /tokenize
            assert 0.9 < record["duration_s"] < 4
        lines = [
            json.loads(line)
            for line in (tmp_path / "gw" / "gateway.log").read_text().splitlines()
            if line.startswith("{")
        ]
        assert any(line.get("status") == 499 for line in lines), "the access log says the client left"
