"""The gateway in front of real vLLM servers, through the official OpenAI SDK (see conftest.py).

The tests run in file order; the last one compares the gateway's ledger with the servers' own token
counters over the whole session.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai import OpenAI

from backends.models import Backend, Pool
from gateway.request.attempts import too_long_for
from tests.vllm.conftest import AMD, MAX_MODEL_LEN, MODEL, QUEUED, VllmEnv

MESSAGES = [{"role": "user", "content": "Hello, world!"}]
SERVERS = {AMD, QUEUED}


@pytest.fixture(scope="module")
def client(vllm_env: VllmEnv) -> Iterator[OpenAI]:
    with OpenAI(base_url=vllm_env.base_url + "/v1", api_key="sk-vllm-e2e", max_retries=0, timeout=120) as c:
        yield c


# Chat and completions, streaming and not


def test_chat(client: OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert raw.headers["x-switchyard-backend"] in SERVERS
    assert raw.headers["x-switchyard-vendor"] in {"amd", "nvidia"}
    reply = raw.parse()
    assert reply.object == "chat.completion" and reply.model == MODEL
    assert reply.choices[0].message.role == "assistant"
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.choices[0].finish_reason in {"length", "stop"}
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    assert reply.usage.completion_tokens == 8 or reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_chat_is_deterministic_at_temperature_0(client: OpenAI) -> None:
    texts = {
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0)
        .choices[0]
        .message.content
        for _ in range(3)
    }
    assert len(texts) == 1


def test_chat_stream_without_usage(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, stream=True
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(chunk.choices for chunk in chunks), "the gateway must strip the usage chunk when not asked"
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason in {"length", "stop"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks)


def test_chat_stream_with_usage(client: OpenAI) -> None:
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *body, last = chunks
    assert last.choices == [] and last.usage is not None
    # A byte-level token may decode to nothing yet (part of a UTF-8 character): chunks <= tokens.
    content_chunks = sum(1 for c in body if c.choices and c.choices[0].delta.content)
    assert 0 < content_chunks <= last.usage.completion_tokens
    assert last.usage.completion_tokens == 6 or body[-1].choices[0].finish_reason == "stop"
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert body[-1].choices[0].finish_reason is not None


def test_stream_text_matches_non_streaming(client: OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    streamed = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == whole.choices[0].message.content


def test_completion(client: OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt="Hello, world!", max_tokens=5, temperature=0
    )
    assert raw.headers["x-switchyard-backend"] in SERVERS
    reply = raw.parse()
    assert reply.object == "text_completion" and isinstance(reply.choices[0].text, str)
    assert reply.usage is not None and reply.usage.completion_tokens == 5


def test_completion_stream_with_and_without_usage(client: OpenAI) -> None:
    plain = list(
        client.completions.create(model=MODEL, prompt="Hello", max_tokens=5, temperature=0, stream=True)
    )
    assert all(c.choices for c in plain) and all(c.usage is None for c in plain)
    with_usage = list(
        client.completions.create(
            model=MODEL,
            prompt="Hello",
            max_tokens=5,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert with_usage[-1].choices == [] and with_usage[-1].usage is not None
    assert with_usage[-1].usage.completion_tokens == 5
    assert "".join(c.choices[0].text for c in plain) == "".join(c.choices[0].text for c in with_usage[:-1])


# Errors


def test_unknown_model_is_404(client: OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
    assert info.value.status_code == 404
    assert info.value.code == "model_not_found"


def test_max_tokens_beyond_any_window_is_refused_by_the_gateway(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=5000)
    body = info.value.body
    assert isinstance(body, dict) and set(body) >= {"message", "type", "param", "code"}
    assert info.value.code == "context_length_exceeded"


def test_vllms_own_400_comes_back_in_openai_shape(client: OpenAI, vllm_env: VllmEnv) -> None:
    """A prompt the gateway under-counts (it estimates 4 characters per token; 600 CJK characters are 150 by
    that estimate and well over 512 real tokens for this byte-level tokenizer) passes the gateway's check;
    vLLM refuses it, and its 400 reaches the client in OpenAI's shape, its message kept."""
    before = {name: vllm_env.counters(name) for name in SERVERS}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "漢" * 600}], max_tokens=8
        )
    error = info.value
    assert error.status_code == 400
    # Noticed: docs/api.md says every response carries x-switchyard-backend; a relayed backend 4xx does not.
    body = error.response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "param", "code"}
    print(f"\nvLLM's 400 through the gateway: {body}")
    # vLLM's own words, in OpenAI's types and string codes (vLLM sends `BadRequestError` and `400`)
    assert body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["code"] == "context_length_exceeded", body
    assert str(MAX_MODEL_LEN) in body["error"]["message"], body  # it names the server's max_model_len
    assert {name: vllm_env.counters(name) for name in SERVERS} == before
    # Had a backend with a longer window been a candidate, the gateway would have sent the prompt there:
    # it reads vLLM's own words as a refusal for length (gateway/request/attempts.py)
    pool = Pool("p", "amd", "mi300x", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={})
    short, longer = (
        Backend(name=f"b{n}", url="http://127.0.0.1:1", models=frozenset({MODEL}), max_model_len=n, pool=pool)
        for n in (MAX_MODEL_LEN, 4 * MAX_MODEL_LEN)
    )
    assert too_long_for(short, error.response.content, [short, longer])
    assert not too_long_for(short, error.response.content, [short])


UNPARSEABLE_BODIES = [
    b'{"model":"MODEL","messages":[{"role":"user","content":"hel\xfflo"}],"max_tokens":4}',
    b'{"model":"MODEL","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"x":"\xff"}',
    b'{"model":"MODEL","x":' + b"[" * 5000 + b"]" * 5000 + b"}",
]


@pytest.mark.parametrize("body", UNPARSEABLE_BODIES, ids=["utf8-content", "utf8-unknown-field", "nesting"])
def test_the_simulator_refuses_unparseable_bodies_as_vllm_does(vllm_env: VllmEnv, body: bytes) -> None:
    """Issue 15 item 11: a body vLLM cannot parse gets vLLM's 400 from the simulator too (the same status
    and body), and the gateway never forwards it (its own 400, vLLM's counters unchanged)."""
    import asyncio

    from backends.sim.app import start_server
    from backends.sim.options import SimOptions

    body = body.replace(b"MODEL", MODEL.encode())
    headers = {"content-type": "application/json"}
    server = vllm_env.servers[AMD]
    real = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers, trust_env=False)

    async def simulated() -> httpx.Response:
        sim = await start_server(SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=0.5))
        try:
            async with httpx.AsyncClient(trust_env=False) as http:
                return await http.post(sim.url + "/v1/chat/completions", content=body, headers=headers)
        finally:
            await sim.close()

    sim = asyncio.run(simulated())
    print(f"\nvLLM: {real.status_code} {real.text[:200]}\nsim:  {sim.status_code} {sim.text[:200]}")
    assert real.status_code == sim.status_code == 400
    assert sim.json() == real.json()

    before = {name: vllm_env.counters(name) for name in SERVERS}
    gateway = httpx.post(
        vllm_env.base_url + "/v1/chat/completions", content=body, headers=headers, trust_env=False
    )
    assert gateway.status_code == 400 and gateway.json()["error"]["code"] == "invalid_json", gateway.text
    assert {name: vllm_env.counters(name) for name in SERVERS} == before


# Client disconnect mid-stream


DISCONNECT_ATTEMPTS = 3


def test_client_disconnect_aborts_the_vllm_request(vllm_env: VllmEnv) -> None:
    """The client goes away after the first generated token; vLLM must stop well before the 495 tokens asked
    for. The tiny model makes several hundred tokens a second (over a thousand on a fast machine), so a
    stall of the machine can let a stream run to its end before the disconnect reaches vLLM: such an attempt
    proves nothing and the scenario runs again, and it fails if no attempt of three stops early."""
    body = {
        "model": MODEL,
        "messages": MESSAGES,
        "max_tokens": 495,  # with the prompt's 13 tokens, just inside max_model_len
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    asked = body["max_tokens"]
    headers = {"x-session-id": "disconnect"}
    runs: list[tuple[str, float, int]] = []
    for _ in range(DISCONNECT_ATTEMPTS):
        vllm_env.wait_idle()
        before = {name: vllm_env.counters(name) for name in SERVERS}
        seen = 0
        with (
            httpx.Client(base_url=vllm_env.base_url, timeout=60, trust_env=False) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r,
        ):
            assert r.status_code == 200
            server = vllm_env.servers[r.headers["x-switchyard-backend"]]
            for line in r.iter_lines():
                seen += _content_chunk(line)
                if seen:
                    break
        # The connection is closed here, after the first token.
        deadline = time.monotonic() + 20
        while server.gauge("vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "vLLM kept generating after the client went away"
            time.sleep(0.1)
        name = server.name
        generated = vllm_env.counters(name)["completion_tokens"] - before[name]["completion_tokens"]
        vllm_env.abandoned_generated[name] = vllm_env.abandoned_generated.get(name, 0) + generated
        vllm_env.abandoned_seen[name] = vllm_env.abandoned_seen.get(name, 0) + seen
        runs.append((name, generated, seen))
        if generated < asked:
            break
    print(f"\nabandoned streams (server, tokens vLLM generated of {asked}, tokens the client saw): {runs}")
    assert seen == 1 and 0 < generated < asked, runs


def _content_chunk(line: str) -> int:
    """1 for an SSE line whose chunk carries generated text (one token each from vLLM's stream)."""
    if not line.startswith("data: {"):
        return 0
    choices = json.loads(line.removeprefix("data: "))["choices"]
    return int(bool(choices and choices[0]["delta"].get("content")))


# The scraper and queue-aware routing


def _explain(vllm_env: VllmEnv) -> dict[str, Any]:
    r = httpx.post(
        vllm_env.base_url + "/admin/v1/explain",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 8},
        trust_env=False,
    )
    r.raise_for_status()
    return r.json()


def _backend_loads(vllm_env: VllmEnv) -> dict[str, dict[str, float]]:
    r = httpx.get(vllm_env.base_url + "/admin/v1/backends", trust_env=False)
    r.raise_for_status()
    return {b["name"]: b["load"] for b in r.json()["data"]}


def test_scraper_reads_real_metrics_and_routing_avoids_the_queue(client: OpenAI, vllm_env: VllmEnv) -> None:
    """The `--max-num-seqs 2` server is given a queue directly (four long requests sent to it, not through
    the gateway), the scraper sees its `num_requests_waiting`, and while it does, the route's saturation
    limit (`max_waiting: 0`) makes every routing decision of 12 concurrent long gateway requests put the
    other server first (checked with the live explain endpoint).

    The queue is made directly because routing itself avoids making one: left to the gateway, the
    2-slot server may never see more than one request at a time. How the 12 requests end up split is
    not asserted beyond that; what routing does with a queue is what matters."""
    vllm_env.wait_idle()
    time.sleep(0.6)  # a few scrapes (every 0.2 s) after the servers went idle
    idle = _backend_loads(vllm_env)
    assert set(idle) == SERVERS
    assert all(load == {"running": 0, "waiting": 0, "kv_cache_usage": 0} for load in idle.values()), idle
    explained = _explain(vllm_env)
    assert set(explained["order"]) == SERVERS

    seen: dict[str, dict[str, float]] = {name: {"running": 0, "waiting": 0, "kv": 0} for name in SERVERS}
    where: Counter[str] = Counter()
    decisions_while_queued: list[tuple[str, str]] = []

    def one(i: int) -> str:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Request {i}: tell me a story."}],
            max_tokens=400,  # the tiny model is fast: long outputs make the 2-slot server queue
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        assert raw.parse().usage.completion_tokens == 400  # type: ignore[union-attr]
        return raw.headers["x-switchyard-backend"]

    direct = OpenAI(base_url=vllm_env.servers[QUEUED].url + "/v1", api_key="none", max_retries=0)
    outside_lock = threading.Lock()

    def straight_to_the_queued_server(i: int) -> None:
        reply = direct.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Direct {i}: tell me a story."}],
            max_tokens=400,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        usage = reply.usage
        assert usage is not None
        with outside_lock:
            vllm_env.served_outside(QUEUED, usage.prompt_tokens, usage.completion_tokens)

    def look() -> None:
        loads = _backend_loads(vllm_env)
        for name, load in loads.items():
            seen[name]["running"] = max(seen[name]["running"], load["running"])
            seen[name]["waiting"] = max(seen[name]["waiting"], load["waiting"])
            seen[name]["kv"] = max(seen[name]["kv"], load["kv_cache_usage"])
        if loads[QUEUED]["waiting"] >= 1 and loads[AMD]["waiting"] == 0:
            explained = _explain(vllm_env)
            queued_note = next(
                c["why_not"] for c in explained["explanation"]["candidates"] if c["backend"] == QUEUED
            )
            if queued_note is not None:  # the same scrape the gateway routed on
                decisions_while_queued.append((explained["order"][0], queued_note))

    stop = threading.Event()

    def keep_a_queue() -> None:
        """Four requests at a time straight to the 2-slot server, until the gateway's requests are done."""
        with ThreadPoolExecutor(4) as direct_pool:
            n = 0
            while not stop.is_set():
                list(direct_pool.map(straight_to_the_queued_server, range(n, n + 4), timeout=120))
                n += 4

    deadline = time.monotonic() + 120
    with ThreadPoolExecutor(13) as pool:
        keeper = pool.submit(keep_a_queue)
        time.sleep(0.5)  # the queue forms and the scraper (every 0.2 s) reports it
        futures = []
        for i in range(12):
            futures.append(pool.submit(one, i))
            for _ in range(3):  # spaced beyond the scrape interval; each decision sees the queue as reported
                look()
                time.sleep(0.1)
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            look()
            time.sleep(0.1)
        stop.set()
        for future in futures:
            where[future.result(timeout=max(1.0, deadline - time.monotonic()))] += 1
        keeper.result(timeout=max(1.0, deadline - time.monotonic()))

    print(f"\nrouted: {dict(where)}; peak scraped load: {seen}")
    assert sum(where.values()) == 12
    # The scraper read the real gauges while they moved.
    assert max(s["running"] for s in seen.values()) >= 2, seen
    assert seen[QUEUED]["running"] <= 2, seen  # its --max-num-seqs
    assert any(s["kv"] > 0 for s in seen.values()), seen
    # Queue-aware routing: whenever the gateway saw the queue, the other server came first.
    assert seen[QUEUED]["waiting"] >= 1, seen
    if not decisions_while_queued:  # the queue showed only between two of our polls: judge by the split
        assert where[AMD] > where[QUEUED], where
    assert all(first == AMD for first, _ in decisions_while_queued), decisions_while_queued
    assert all("waiting" in note for _, note in decisions_while_queued), decisions_while_queued
    assert where[AMD] >= 1, where


# The ledger against the servers' own counters


def _ledger(vllm_env: VllmEnv) -> dict[str, dict[str, float]]:
    usage = vllm_env.usage_by_backend()
    zero = {"prompt_tokens": 0, "completion_tokens": 0}
    return {n: {k: usage.get(n, zero)[k] for k in zero} for n in SERVERS}


# The Responses API and Anthropic's Messages API, through the official SDKs


def _drained(vllm_env: VllmEnv, backend: str, drain: bool) -> None:
    action = "drain" if drain else "undrain"
    r = httpx.post(f"{vllm_env.base_url}/admin/v1/backends/{backend}/{action}", trust_env=False)
    assert r.status_code == 200, r.text


def test_a_response_and_its_follow_up_on_the_other_backend(client: OpenAI, vllm_env: VllmEnv) -> None:
    first = client.responses.with_raw_response.create(
        model=MODEL, input="Hello, world!", max_output_tokens=6, temperature=0
    )
    answered_by = first.headers["x-switchyard-backend"]
    response = first.parse()
    assert response.status in ("completed", "incomplete") and response.usage is not None
    assert 0 < response.usage.output_tokens <= 6
    # vLLM keeps no response: the gateway expands the conversation itself, so the follow-up may go to any
    # backend. Draining the first one sends it to the other.
    _drained(vllm_env, answered_by, True)
    try:
        second = client.responses.with_raw_response.create(
            model=MODEL,
            input="And then?",
            previous_response_id=response.id,
            max_output_tokens=4,
            temperature=0,
        )
    finally:
        _drained(vllm_env, answered_by, False)
    assert second.headers["x-switchyard-backend"] != answered_by
    follow_up = second.parse()
    assert follow_up.previous_response_id == response.id and follow_up.usage is not None
    assert follow_up.usage.input_tokens > response.usage.input_tokens, "the first turn was sent along"
    stored = client.responses.retrieve(follow_up.id)
    assert stored.id == follow_up.id
    client.responses.delete(follow_up.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(follow_up.id)


def test_a_streamed_response_sends_its_typed_events(client: OpenAI) -> None:
    stream = client.responses.create(model=MODEL, input="Hello, world!", max_output_tokens=5, stream=True)
    kinds = [event.type for event in stream]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds


def test_messages_through_the_anthropic_sdk(vllm_env: VllmEnv) -> None:
    with anthropic.Anthropic(base_url=vllm_env.base_url, api_key="sk-vllm-e2e", max_retries=0) as claude:
        message = claude.messages.create(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hello, world!"}]
        )
        assert message.type == "message" and 0 < message.usage.output_tokens <= 5
        with claude.messages.stream(
            model=MODEL, max_tokens=5, messages=[{"role": "user", "content": "Hello again"}]
        ) as stream:
            final = stream.get_final_message()
        assert 0 < final.usage.output_tokens <= 5 and final.usage.input_tokens > 0
        with pytest.raises(anthropic.NotFoundError):
            claude.messages.create(
                model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "Hi"}]
            )


def _settled(vllm_env: VllmEnv) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    vllm_env.wait_idle()
    time.sleep(0.5)  # the ledger is fed off the request path
    return _ledger(vllm_env), {n: vllm_env.counters(n) for n in SERVERS}


def test_ledger_matches_vllm_for_completed_requests(client: OpenAI, vllm_env: VllmEnv) -> None:
    ledger_before, vllm_before = _settled(vllm_env)
    prompts = [f"Ledger check {i}: " + "words " * (i * 7) for i in range(8)]

    def one(i: int) -> None:
        stream, usage = i % 2 == 0, i % 4 == 0
        extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream and usage else {}
        if i % 3 == 0:
            reply = client.completions.create(
                model=MODEL, prompt=prompts[i], max_tokens=5 + i, temperature=0, stream=stream, **extra
            )
        else:
            reply = client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": prompts[i]}],
                max_tokens=5 + i,
                temperature=0,
                stream=stream,
                **extra,
            )
        if stream:
            list(reply)  # type: ignore[call-overload]

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(one, range(8), timeout=120))
    ledger_after, vllm_after = _settled(vllm_env)
    for name in SERVERS:
        ledger = {k: ledger_after[name][k] - ledger_before[name][k] for k in ledger_after[name]}
        counted = {k: vllm_after[name][k] - vllm_before[name][k] for k in vllm_after[name]}
        assert ledger == counted, f"{name}: ledger {ledger} != vLLM counters {counted}"
    total = sum(ledger_after[n]["completion_tokens"] - ledger_before[n]["completion_tokens"] for n in SERVERS)
    assert total == sum(5 + i for i in range(8))


def test_ledger_matches_vllm_over_the_whole_session(vllm_env: VllmEnv) -> None:
    """Keep this test last: every request of the session, including the abandoned stream (whose prompt
    the gateway has vLLM count with POST /tokenize, since the stream never sent its usage)."""
    ledger, now = _settled(vllm_env)
    for name in SERVERS:
        start = vllm_env.counters_at_start[name]
        outside = vllm_env.outside.get(name, {"prompt_tokens": 0, "completion_tokens": 0})
        delta = {k: now[name][k] - start[k] - outside[k] for k in now[name]}
        assert ledger[name]["prompt_tokens"] == delta["prompt_tokens"], f"{name}: {ledger[name]} != {delta}"
        unseen = delta["completion_tokens"] - ledger[name]["completion_tokens"]
        print(f"\n{name}: ledger {ledger[name]}, vLLM counters delta {delta}")
        if name not in vllm_env.abandoned_seen:
            assert unseen == 0, f"{name}: ledger {ledger[name]} != vLLM counters delta {delta}"
            continue
        # The abandoned streams: the gateway half-closes the connection and counts every token vLLM sent
        # until it took the disconnect. What its engine generates after that, before the abort reaches
        # it, never leaves vLLM: 1-4 tokens at a few hundred tokens a second, 33 on a machine three times
        # as fast. So the ledger holds at least what reached the client and at most what vLLM generated
        # for the streams: counted as nothing or as their max_tokens, it fails.
        seen, generated = vllm_env.abandoned_seen[name], vllm_env.abandoned_generated[name]
        assert seen >= 1 and 0 <= unseen <= generated - seen, (
            f"{name}: ledger {ledger[name]}, vLLM delta {delta}; the streams: {generated:g} made, {seen} seen"
        )
