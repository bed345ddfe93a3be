"""Each shipped policy preset routing real SDK traffic on a simulated H100 + MI300X fleet."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from policies.presets import PRESETS_DIR
from tests.support import free_port, metric, running_gateway, sim_metrics

# measures time or capacity on the whole machine: `make test` runs it by itself (pyproject.toml)
pytestmark = pytest.mark.alone

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90,
      ttft_ms: 5, tpot_ms: 1, max_model_len: 8192}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 2, price_per_gpu_hour: 1.75,
      ttft_ms: 5, tpot_ms: 1, max_model_len: 32768}}
"""
SHORT = [{"role": "user", "content": "What is a KV cache?"}]
LONG = [{"role": "user", "content": "Summarise this document. " + "lorem ipsum dolor sit amet " * 1100}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with Fleet(parse_fleet_spec(FLEET, "<routing fleet>"), log_dir=tmp_path_factory.mktemp("fleet")) as f:
        yield f


def config(fleet: Fleet, policy: str, dead_vendor: str | None = None) -> dict[str, Any]:
    data = fleet.gateway_config(health={"interval": 0.3, "timeout": 0.3}, scrape={"interval": 0.2})
    data["policy"] = {"file": policy, "reload_interval": 0.2}
    if dead_vendor is not None:
        for pool in data["pools"]:
            if pool["vendor"] == dead_vendor:
                for backend in pool["backends"]:
                    backend["url"] = f"http://127.0.0.1:{free_port()}"
    return data


def sdk(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url + "/v1", api_key="sk-routing", max_retries=0)


def routed(base_url: str, messages: list[dict[str, str]], **kwargs: Any) -> tuple[str, str, str]:
    """(vendor, pool, class) of one request."""
    raw = sdk(base_url).chat.completions.with_raw_response.create(model=MODEL, messages=messages, **kwargs)
    if kwargs.get("stream"):
        list(raw.parse())
    else:
        raw.parse()
    h = raw.headers
    return h["x-switchyard-vendor"], h["x-switchyard-pool"], h["x-switchyard-class"]


def test_balanced_routes_each_class_where_its_preset_says(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(config(fleet, "balanced"), tmp_path) as base:
        for _ in range(4):
            assert routed(base, SHORT, stream=True, max_tokens=8) == ("nvidia", "h100", "interactive")
        assert routed(base, SHORT, max_tokens=8, extra_headers={"x-switchyard-priority": "high"})[::2] == (
            "nvidia",
            "interactive",
        )
        # a client may name its class (asked while the fleet is idle in the gateway's view: the batch jobs
        # below count on the H100s until the next scrape, and a burst spreads past busy H100s by design)
        assert (
            routed(base, SHORT, max_tokens=8, extra_headers={"x-switchyard-class": "interactive"})[0]
            == "nvidia"
        )
        assert routed(base, LONG, max_tokens=16) == ("amd", "mi300x", "long-context")
        # batch: whichever backend has room, least loaded first (an idle fleet ties: any of them)
        assert routed(base, SHORT, max_tokens=8, n=3)[2] == "batch"
        assert routed(base, SHORT, max_tokens=8, metadata={"priority": "batch"})[2] == "batch"
        # default class: the cheapest backend that meets the SLO; MI300X costs less per token here.
        assert routed(base, SHORT, max_tokens=8) == ("amd", "mi300x", "default")


DOC = [{"role": "user", "content": "Summarise this document. " + "lorem ipsum dolor sit amet " * 1350}]
"""36,475 characters and 6,761 tokens by the simulator's tokenizer: 9,119 at 4 characters a token."""


def explained(base: str, messages: list[dict[str, str]], api_key: str = "sk-routing", **body: Any) -> Any:
    body = {"model": MODEL, "messages": messages, "max_tokens": 16, **body}
    headers = {"authorization": f"Bearer {api_key}"}
    return httpx.post(base + "/admin/v1/explain", json=body, headers=headers).json()


def test_prompt_sizes_are_learned_from_the_backends_counts(fleet: Fleet, tmp_path: Path) -> None:
    """At 4 characters a token the document is past the H100s' 8k window; once the backends have counted
    the caller's prompts, the gateway knows it fits them. Another caller's estimate does not move."""
    with running_gateway(config(fleet, "balanced"), tmp_path) as base:
        before = explained(base, DOC)
        assert before["request_class"] == "long-context"
        assert sorted(before["order"]) == ["mi300x-0", "mi300x-1"], "9.1k estimated: only the MI300X fit"
        assert routed(base, DOC, max_tokens=16) == ("amd", "mi300x", "long-context")  # counted: 6,761
        after = explained(base, DOC)
        assert after["request_class"] == "long-context"
        assert sorted(after["order"]) == ["h100-0", "h100-1", "mi300x-0", "mi300x-1"]
        assert sorted(explained(base, DOC, api_key="sk-another-team")["order"]) == ["mi300x-0", "mi300x-1"]
        # and it is served where the policy now sends it: the count was right
        vendors = {routed(base, DOC, max_tokens=16)[0] for _ in range(4)}
        assert "nvidia" in vendors


def test_a_prompt_the_estimate_undercounts_is_served_by_a_longer_window(fleet: Fleet, tmp_path: Path) -> None:
    """Taught about 5 characters a token by plain words, the gateway estimates 8,500 periods at about 3,400
    tokens; the simulator counts 8,500, past the H100s' 8k. The H100 `latency-first` prefers refuses it as
    too long, and an MI300X serves it at once."""
    with running_gateway(config(fleet, "latency-first"), tmp_path) as base:
        for _ in range(3):
            routed(base, DOC, max_tokens=16)
        dots = [{"role": "user", "content": ". " * 8500}]
        plan = explained(base, dots, stream=True)
        assert plan["request_class"] == "interactive" and plan["order"][0].startswith("h100"), plan["order"]
        h100 = next(b.url for b in fleet.backends if b.name == plan["order"][0])
        refusal = httpx.post(
            h100 + "/v1/chat/completions", json={"model": MODEL, "messages": dots, "max_tokens": 16}
        )
        assert refusal.status_code == 400 and b"maximum context length" in refusal.content
        raw = sdk(base).chat.completions.with_raw_response.create(
            model=MODEL, messages=dots, max_tokens=16, stream=True
        )
        assert len([chunk for chunk in raw.parse() if chunk.choices]) >= 1
        assert raw.headers["x-switchyard-vendor"] == "amd"
        assert raw.headers["x-switchyard-attempts"] == "2"  # the H100 first, refused for length


def test_latency_first_spills_to_mi300x_when_h100s_are_down(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(config(fleet, "latency-first"), tmp_path / "up") as base:
        assert routed(base, SHORT, max_tokens=8)[0] == "nvidia"
    with running_gateway(config(fleet, "latency-first", dead_vendor="nvidia"), tmp_path / "down") as base:
        assert routed(base, SHORT, max_tokens=8) == ("amd", "mi300x", "interactive")


def test_latency_first_spills_when_h100s_cannot_meet_the_slo(tmp_path: Path) -> None:
    slow_h100 = FLEET.replace(
        "ttft_ms: 5, tpot_ms: 1, max_model_len: 8192", "ttft_ms: 1200, tpot_ms: 1, max_model_len: 8192"
    )
    spec = parse_fleet_spec(slow_h100, "<slow h100>")
    with (
        Fleet(spec, log_dir=tmp_path) as slow,
        running_gateway(config(slow, "latency-first"), tmp_path) as base,
    ):
        if True:
            first = [routed(base, SHORT, stream=True, max_tokens=4)[0] for _ in range(2)]
            assert first == ["nvidia", "nvidia"], "before any measurement the H100 prior wins"
            later = [routed(base, SHORT, stream=True, max_tokens=4)[0] for _ in range(4)]
            assert later == ["amd"] * 4, "measured TTFT of 1.2 s misses the 800 ms SLO: spill to MI300X"
            explain = httpx.post(
                base + "/admin/v1/explain",
                json={"model": MODEL, "messages": SHORT, "stream": True, "max_tokens": 4},
            ).json()
            notes = {c["backend"]: c["why_not"] for c in explain["explanation"]["candidates"]}
            assert "SLO" in (notes["h100-0"] or "") and "SLO" in (notes["h100-1"] or "")


def test_capacity_first_sends_long_and_batch_work_to_mi300x(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(config(fleet, "capacity-first"), tmp_path) as base:
        assert routed(base, LONG, max_tokens=16) == ("amd", "mi300x", "long-context")
        assert routed(base, SHORT, max_tokens=8, n=2) == ("amd", "mi300x", "batch")
        assert routed(base, SHORT, max_tokens=3000) == ("amd", "mi300x", "batch")
        pools = {routed(base, SHORT, max_tokens=4)[1] for _ in range(8)}
        assert pools == {"h100", "mi300x"}, "the rest spreads over every pool"


def test_cheapest_prefers_the_lower_cost_per_token_and_falls_back(fleet: Fleet, tmp_path: Path) -> None:
    with running_gateway(config(fleet, "cheapest"), tmp_path / "up") as base:
        assert {routed(base, SHORT, max_tokens=4)[0] for _ in range(4)} == {"amd"}
    with running_gateway(config(fleet, "cheapest", dead_vendor="amd"), tmp_path / "down") as base:
        assert routed(base, SHORT, max_tokens=4)[0] == "nvidia"


def test_refusals_say_why(fleet: Fleet, tmp_path: Path) -> None:
    huge = [{"role": "user", "content": "x " * 80_000}]
    with running_gateway(config(fleet, "balanced"), tmp_path) as base:
        with pytest.raises(openai.BadRequestError) as caught:
            sdk(base).chat.completions.create(model=MODEL, messages=huge, max_tokens=10)
        assert caught.value.code == "context_length_exceeded"
        assert "32768" in caught.value.message
    only_nvidia = tmp_path / "nvidia-only.yaml"
    only_nvidia.write_text("routes:\n  default:\n    prefer: {vendor: nvidia}\n")
    with running_gateway(config(fleet, str(only_nvidia), dead_vendor="nvidia"), tmp_path / "dead") as base:
        with pytest.raises(openai.InternalServerError) as caught_503:
            sdk(base).chat.completions.create(model=MODEL, messages=SHORT, max_tokens=4)
        assert caught_503.value.status_code == 503
        assert "failed its health check" in caught_503.value.message


def test_hot_reload_applies_valid_changes_and_keeps_the_last_good_policy(
    fleet: Fleet, tmp_path: Path
) -> None:
    policy = tmp_path / "policy.yaml"
    shutil.copy(PRESETS_DIR / "cheapest.yaml", policy)
    with running_gateway(config(fleet, str(policy)), tmp_path) as base:
        assert routed(base, SHORT, max_tokens=4)[0] == "amd"

        async def in_flight() -> list[str]:
            client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="k", max_retries=0)
            streams = [
                await client.chat.completions.create(model=MODEL, messages=SHORT, max_tokens=400, stream=True)
                for _ in range(4)
            ]
            # Change the policy while the four streams are still generating.
            policy.write_text("name: nvidia-only\nroutes:\n  default:\n    prefer: {vendor: nvidia}\n")
            texts = []
            for stream in streams:
                texts.append("".join([c.choices[0].delta.content or "" async for c in stream if c.choices]))
            await client.close()
            return texts

        texts = asyncio.run(in_flight())
        assert all(len(t.split()) > 100 for t in texts), "in-flight streams finished whole"
        deadline = time.monotonic() + 5
        while httpx.get(base + "/admin/v1/policy").json()["name"] != "nvidia-only":
            assert time.monotonic() < deadline, "the valid change was not applied"
            time.sleep(0.1)
        assert {routed(base, SHORT, max_tokens=4)[0] for _ in range(3)} == {"nvidia"}

        policy.write_text("name: broken\nroutes:\n  default:\n    prefer: {vendor: intel}\n")
        deadline = time.monotonic() + 5
        while (state := httpx.get(base + "/admin/v1/policy").json())["rejected_reloads"] < 1:
            assert time.monotonic() < deadline, "the invalid change was not noticed"
            time.sleep(0.1)
        assert state["name"] == "nvidia-only"
        assert "policy.yaml:4" in state["last_reload_error"]
        assert routed(base, SHORT, max_tokens=4)[0] == "nvidia"
        log = (tmp_path / "gateway.log").read_text()
        assert "policy change refused" in log


SHEDDING_POLICY = """
name: shedding
classes:
  - name: batch
    when: {n: {gt: 1}}
routes:
  batch:
    prefer: any
    saturation: {LIMIT}
    shed: true
    backpressure: {max_wait_ms: 300, retry_after_s: 3}
  default:
    prefer: any
"""


# One n=2 request per backend either way: one request, or the two sequences (seats) it holds.
@pytest.mark.parametrize("limit", ["max_inflight: 1", "max_seqs: 2"])
def test_a_shed_class_is_refused_with_retry_after_while_the_protected_class_is_served(
    tmp_path: Path, limit: str
) -> None:
    slow = FLEET.replace("ttft_ms: 5, tpot_ms: 1", "ttft_ms: 5, tpot_ms: 10")
    policy = tmp_path / "shedding.yaml"
    policy.write_text(SHEDDING_POLICY.replace("LIMIT", limit))
    with (
        Fleet(parse_fleet_spec(slow, "<slow>"), log_dir=tmp_path / "fleet") as f,
        running_gateway(config(f, str(policy)), tmp_path / "gw") as base,
    ):

        async def scenario() -> tuple[list[httpx.Response], httpx.Response]:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                body = {"model": MODEL, "messages": SHORT, "max_tokens": 200}
                # Each of the 4 backends takes one batch request (its limit); the rest are held 300 ms,
                # then refused, while a request of the unshed class goes straight through.
                batch = [
                    asyncio.create_task(client.post("/v1/chat/completions", json={**body, "n": 2}))
                    for _ in range(6)
                ]
                await asyncio.sleep(0.1)
                started = time.monotonic()
                plain = await client.post("/v1/chat/completions", json={**body, "max_tokens": 4})
                assert time.monotonic() - started < 1.0
                answers = list(await asyncio.gather(*batch))
                # every slot and seat is given back once the answers are in
                held = (await client.get("/admin/v1/backends")).json()["data"]
                assert [(b["inflight"], b["inflight_seqs"]) for b in held] == [(0, 0)] * 4
                assert [b["prompt_tokens_by_class"] for b in held] == [{}] * 4
                return answers, plain

        batch, plain = asyncio.run(scenario())
    assert plain.status_code == 200 and plain.headers["x-switchyard-class"] == "default"
    codes = sorted(r.status_code for r in batch)
    assert codes == [200] * 4 + [429] * 2
    refused = [r for r in batch if r.status_code == 429]
    for r in refused:
        assert r.headers["retry-after"] == "3"
        assert r.json()["error"]["code"] == "overloaded"
        assert r.json()["error"]["type"] == "rate_limit_error"


STREAMS = 1200


def test_past_a_backends_seats_requests_queue_where_its_metrics_show_them(tmp_path: Path) -> None:
    # 1,200 streams at once to one backend, past vLLM's 1,024 seats on an H100. The gateway sends all of
    # them, so those past the seats wait in vLLM's queue, which its scrape (`num_requests_waiting`) and so
    # the router see. With as many connections per backend as the backend has seats (256, then 1,024
    # during issue 18), the gateway kept the rest in its own connection pool: the backend showed no queue
    # and the router went on piling work onto it.
    spec = f"""
model: {MODEL}
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.90,
      ttft_ms: 10000, tpot_ms: 1, max_model_len: 8192}}
"""
    # Each request holds its seat for 10 s, longer than a slow machine's client takes to open 1,200
    # streams (its event loop also runs the polling below, which it can starve for seconds).
    with Fleet(parse_fleet_spec(spec, "<one backend>"), log_dir=tmp_path / "fleet") as one:
        data = one.gateway_config(connections={"max_per_client": 2000})
        data["policy"] = {"file": "balanced"}
        sim = one.backends[0].url

        async def burst() -> tuple[list[str | None], float]:
            # the SDK's own pool stops at 1,000 connections
            http = openai.DefaultAsyncHttpxClient(limits=httpx.Limits(max_connections=STREAMS))
            # 60 s for every phase: the SDK's 5 s to connect is about a busy machine's accept queue
            client = openai.AsyncOpenAI(
                base_url=base + "/v1", api_key="sk-seats", max_retries=0, http_client=http, timeout=60.0
            )
            async with client:

                async def one_stream() -> str | None:
                    stream = await client.chat.completions.create(
                        model=MODEL, messages=SHORT, max_tokens=1, stream=True
                    )
                    reason = None
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            reason = chunk.choices[0].finish_reason
                    return reason

                tasks = [asyncio.create_task(one_stream()) for _ in range(STREAMS)]
                seen = 0.0
                deadline = time.monotonic() + 9.0
                while time.monotonic() < deadline and seen < STREAMS:
                    await asyncio.sleep(0.1)
                    values = await asyncio.to_thread(sim_metrics, sim)
                    now = metric(values, "vllm:num_requests_running") + metric(
                        values, "vllm:num_requests_waiting"
                    )
                    seen = max(seen, now)
                return await asyncio.gather(*tasks), seen

        with running_gateway(data, tmp_path / "gw") as base:
            finished, seen = asyncio.run(burst())
        assert seen == STREAMS
        assert finished == ["length"] * STREAMS
