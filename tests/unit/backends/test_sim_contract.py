"""The simulator keeps the shape of real vLLM: its answers are compared with responses recorded from a real
vLLM server (tests/vllm/fixtures/, written by tests/vllm/record_fixtures.py; index.json says which version).

Shapes, not values: JSON key paths (recursively, list items merged), the order of stream chunks (role chunk,
content chunks, finish chunk, usage chunk with empty `choices`, `[DONE]`), error bodies and statuses, the
model list, and the metric names a router reads. Where the simulator is known to differ, the exact-shape
test is marked xfail(strict=True) with the difference in its reason, so fixing the simulator (or a vLLM
upgrade that changes the recording) makes the test fail until the mark is updated.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from backends.scraper import parse_engine_load
from backends.sim.app import RunningServer, start_server
from backends.sim.options import SimOptions

FIXTURES = Path(__file__).resolve().parents[2] / "vllm" / "fixtures"
INDEX = json.loads((FIXTURES / "index.json").read_text())
MODEL = INDEX["served_model_name"]


@pytest.fixture(scope="module")
async def sim() -> AsyncIterator[RunningServer]:
    server = await start_server(SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=0.2, max_model_len=512))
    yield server
    await server.close()


@pytest.fixture(scope="module")
async def http(sim: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=sim.url, trust_env=False, timeout=10) as client:
        yield client


# Shapes


def key_paths(value: Any, prefix: str = "") -> set[str]:
    """Every key path in a JSON value: `choices[].message.content`; list items are merged."""
    paths: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else key
            paths.add(path)
            paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, prefix + "[]")
    return paths


def shape_diff(sim: Any, real: Any) -> dict[str, list[str]]:
    ours, theirs = key_paths(sim), key_paths(real)
    return {"missing_in_sim": sorted(theirs - ours), "extra_in_sim": sorted(ours - theirs)}


def sse_events(text: str) -> list[Any]:
    """The `data:` payloads of an SSE body, decoded; `[DONE]` stays a string."""
    events: list[Any] = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block.removeprefix("data: ")
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def chunk_kind(event: Any) -> str:
    """role | content | finish | usage | done, for a chat or completions stream event."""
    if event == "[DONE]":
        return "done"
    choices = event["choices"]
    if not choices:
        return "usage" if event.get("usage") else "empty"
    choice = choices[0]
    if choice.get("finish_reason") is not None:
        return "finish"
    if "role" in choice.get("delta", {}):
        return "role"
    return "content"


def kinds(events: list[Any]) -> str:
    return " ".join(chunk_kind(e) for e in events)


CHAT_ORDER = re.compile(r"role( content)* finish usage done")
CHAT_ORDER_NO_USAGE = re.compile(r"role( content)* finish done")
COMPLETION_ORDER = re.compile(r"(content )*finish usage done")


def stream_shapes(events: list[Any]) -> dict[str, set[str]]:
    """Key paths per chunk kind (the union over the chunks of that kind)."""
    shapes: dict[str, set[str]] = {}
    for event in events:
        if event != "[DONE]":
            shapes.setdefault(chunk_kind(event), set()).update(key_paths(event))
    return shapes


def stream_diff(sim: list[Any], real: list[Any]) -> dict[str, dict[str, list[str]]]:
    ours, theirs = stream_shapes(sim), stream_shapes(real)
    diff: dict[str, dict[str, list[str]]] = {}
    for kind in sorted(set(ours) | set(theirs)):
        a, b = ours.get(kind, set()), theirs.get(kind, set())
        if a != b:
            diff[kind] = {"missing_in_sim": sorted(b - a), "extra_in_sim": sorted(a - b)}
    return diff


# Recordings and the simulator's answers to the same requests


def recorded(name: str) -> Any:
    text = (FIXTURES / name).read_text()
    if name.endswith(".json"):
        return json.loads(text)
    if name.endswith(".sse"):
        return sse_events(text)
    return text


async def replay(http: httpx.AsyncClient, name: str) -> tuple[int, Any]:
    """Send the recorded request of fixture `name` to the simulator: (status, decoded body)."""
    spec = INDEX["fixtures"][name]
    r = await http.request(spec["method"], spec["path"], json=spec["request"])
    if name.endswith(".json"):
        return r.status_code, r.json()
    if name.endswith(".sse"):
        return r.status_code, sse_events(r.text)
    return r.status_code, r.text


def test_fixtures_were_recorded_from_real_vllm() -> None:
    assert INDEX["vllm_version"] and not INDEX["vllm_version"].startswith("sim")
    statuses = {name: spec["status"] for name, spec in INDEX["fixtures"].items()}
    assert statuses.pop("error_unknown_model.json") == 404
    assert statuses.pop("error_too_long.json") == 400
    assert statuses.pop("error_messages_unknown_model.json") == 404
    assert set(statuses.values()) == {200}


# Streams: the order always matches; the keys of each chunk are a subset of vLLM's.


@pytest.mark.parametrize(
    ("name", "order"),
    [
        ("chat_stream.sse", CHAT_ORDER),
        ("chat_stream_no_usage.sse", CHAT_ORDER_NO_USAGE),
        ("completion_stream.sse", COMPLETION_ORDER),
    ],
)
async def test_stream_chunk_order(http: httpx.AsyncClient, name: str, order: re.Pattern[str]) -> None:
    real = recorded(name)
    assert order.fullmatch(kinds(real)), f"the recording itself: {kinds(real)}"
    status, ours = await replay(http, name)
    assert status == 200
    assert order.fullmatch(kinds(ours)), kinds(ours)
    assert ours[-2]["choices"] == [] if "usage" in kinds(real) else ours[-2]["choices"]
    if "usage" in kinds(real):
        assert set(ours[-2]["usage"]) >= {"prompt_tokens", "completion_tokens", "total_tokens"}
        assert set(ours[-2]["usage"]) == set(real[-2]["usage"])


@pytest.mark.parametrize("name", ["chat_stream.sse", "chat_stream_no_usage.sse", "completion_stream.sse"])
async def test_stream_chunks_invent_no_keys(http: httpx.AsyncClient, name: str) -> None:
    _, ours = await replay(http, name)
    diff = stream_diff(ours, recorded(name))
    assert not any(d["extra_in_sim"] for d in diff.values()), diff


# Non-streaming JSON: the simulator invents no key, and has every key a client reads.

CORE_PATHS = {
    "chat.json": {
        "id",
        "object",
        "created",
        "model",
        "choices[].index",
        "choices[].message.role",
        "choices[].message.content",
        "choices[].finish_reason",
        "usage.prompt_tokens",
        "usage.completion_tokens",
        "usage.total_tokens",
    },
    "completion.json": {
        "id",
        "object",
        "created",
        "model",
        "choices[].index",
        "choices[].text",
        "choices[].finish_reason",
        "usage.prompt_tokens",
        "usage.completion_tokens",
        "usage.total_tokens",
    },
    "models.json": {"object", "data[].id", "data[].object", "data[].owned_by", "data[].max_model_len"},
    "error_unknown_model.json": {"error.message", "error.type", "error.param", "error.code"},
    "error_too_long.json": {"error.message", "error.type", "error.param", "error.code"},
}


@pytest.mark.parametrize(
    "name",
    [
        "chat.json",
        "completion.json",
        "models.json",
        "error_unknown_model.json",
        "error_too_long.json",
    ],
)
async def test_json_core_keys_and_no_invented_keys(http: httpx.AsyncClient, name: str) -> None:
    real = recorded(name)
    status, ours = await replay(http, name)
    assert status == INDEX["fixtures"][name]["status"]
    assert CORE_PATHS[name] <= key_paths(real), "the recording lacks a core key"
    assert CORE_PATHS[name] <= key_paths(ours)
    assert not shape_diff(ours, real)["extra_in_sim"], shape_diff(ours, real)


@pytest.mark.parametrize("name", ["error_unknown_model.json", "error_too_long.json"])
async def test_error_bodies_match(http: httpx.AsyncClient, name: str) -> None:
    real = recorded(name)
    status, ours = await replay(http, name)
    assert status == INDEX["fixtures"][name]["status"] == real["error"]["code"]
    assert key_paths(ours) == key_paths(real)
    assert ours["error"]["type"] == real["error"]["type"]
    assert ours["error"]["code"] == real["error"]["code"]


@pytest.mark.parametrize(
    "name",
    [
        "error_unknown_model.json",
        "error_too_long.json",
    ],
)
async def test_error_param_matches(http: httpx.AsyncClient, name: str) -> None:
    _, ours = await replay(http, name)
    assert ours["error"]["param"] == recorded(name)["error"]["param"]


async def test_model_list_matches(http: httpx.AsyncClient) -> None:
    status, ours = await replay(http, "models.json")
    assert status == 200
    assert shape_diff(ours, recorded("models.json")) == {"missing_in_sim": [], "extra_in_sim": []}


# Exact shapes: every key vLLM sends, and no other. A known difference would be an xfail(strict=True) here.


@pytest.mark.parametrize(
    "name",
    [
        "chat.json",
        "completion.json",
    ],
)
async def test_json_exact_shape(http: httpx.AsyncClient, name: str) -> None:
    _, ours = await replay(http, name)
    assert shape_diff(ours, recorded(name)) == {"missing_in_sim": [], "extra_in_sim": []}


@pytest.mark.parametrize(
    "name",
    [
        "chat_stream.sse",
        "chat_stream_no_usage.sse",  # without the usage chunk, the finish chunk has system_fingerprint
        "completion_stream.sse",
    ],
)
async def test_stream_exact_shape(http: httpx.AsyncClient, name: str) -> None:
    _, ours = await replay(http, name)
    assert stream_diff(ours, recorded(name)) == {}


# Metrics


def metric_types(text: str) -> dict[str, str]:
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, flags=re.MULTILINE))


def sample_names(text: str) -> set[str]:
    return {re.split(r"[{ ]", line, maxsplit=1)[0] for line in text.splitlines() if line and line[0] != "#"}


def sample_labels(text: str, name: str) -> set[str]:
    labels: set[str] = set()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            labels |= set(re.findall(r'(\w+)="', line.split("}", 1)[0]))
    return labels


ROUTER_GAUGES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"]
COUNTERS = [
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
    "vllm:request_success",
]
HISTOGRAMS = [
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
]


async def test_metric_names_types_and_labels(http: httpx.AsyncClient) -> None:
    real = recorded("metrics.txt")
    ours = (await http.get("/metrics")).text
    real_names, our_names = sample_names(real), sample_names(ours)
    real_types, our_types = metric_types(real), metric_types(ours)
    expected: dict[str, str] = {}
    for gauge in ROUTER_GAUGES:
        expected[gauge] = "gauge"
    for counter in COUNTERS:
        expected[counter + "_total"] = "counter"
    for histogram in HISTOGRAMS:
        for suffix in ("_bucket", "_sum", "_count"):
            expected[histogram + suffix] = "histogram"
    expected["vllm:cache_config_info"] = "gauge"
    for sample, kind in expected.items():
        family = sample.removesuffix("_total") if kind == "counter" else sample
        family = re.sub(r"_(bucket|sum|count)$", "", family) if kind == "histogram" else family
        # A counter's TYPE line may name the family with or without `_total` (test_counter_type_lines_match
        # pins the `_total` form vLLM writes).
        assert sample in real_names, f"vLLM lacks {sample}"
        assert kind in (real_types.get(family), real_types.get(sample)), f"vLLM types {sample} otherwise"
        assert sample in our_names, f"simulator lacks {sample}"
        assert kind in (our_types.get(family), our_types.get(sample)), f"simulator types {sample} otherwise"
    for sample in [*ROUTER_GAUGES, "vllm:prompt_tokens_total", "vllm:generation_tokens_total"]:
        assert sample_labels(ours, sample) == sample_labels(real, sample), sample
    assert sample_labels(ours, "vllm:request_success_total") == sample_labels(
        real, "vllm:request_success_total"
    )
    for key in ("block_size", "num_gpu_blocks"):
        assert key in sample_labels(real, "vllm:cache_config_info")
        assert key in sample_labels(ours, "vllm:cache_config_info")


async def test_cache_config_info_identity_labels(http: httpx.AsyncClient) -> None:
    real = sample_labels(recorded("metrics.txt"), "vllm:cache_config_info")
    ours = sample_labels((await http.get("/metrics")).text, "vllm:cache_config_info")
    assert {"engine", "model_name"} & ours == {"engine", "model_name"} & real


async def test_scraper_reads_both_alike(http: httpx.AsyncClient) -> None:
    real = parse_engine_load(recorded("metrics.txt"))
    ours = parse_engine_load((await http.get("/metrics")).text)
    assert real is not None and ours is not None
    assert (real.running, real.waiting) == (0, 0) and 0 <= real.kv_cache_usage <= 1
    assert (ours.running, ours.waiting) == (0, 0) and 0 <= ours.kv_cache_usage <= 1


async def test_counter_type_lines_match(http: httpx.AsyncClient) -> None:
    real, ours = metric_types(recorded("metrics.txt")), metric_types((await http.get("/metrics")).text)
    for counter in COUNTERS:
        assert ours.get(counter + "_total") == real.get(counter + "_total") == "counter", counter
        assert ours.get(counter + "_created") == real.get(counter + "_created") == "gauge", counter
    for histogram in HISTOGRAMS:
        assert ours.get(histogram + "_created") == real.get(histogram + "_created") == "gauge", histogram
