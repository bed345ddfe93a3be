"""The Responses API through two gateway replicas with API keys, sharing Redis, each routing to its own
simulated backend: a follow-up (`previous_response_id`) sent to the other replica lands on another backend
and still continues the conversation, since the gateway stores responses itself (vLLM stores none).
Stored responses are a key's own; bad ids and huge inputs are OpenAI errors that change nothing. The
Messages API's key errors (401, 429) come in Anthropic's shape here too."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest
import redis

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from gateway.redis.client import redis_client
from gateway.responses.store import RedisResponseStore
from tests.integration.conftest import Env
from tests.redis_cluster import RedisCluster
from tests.support import clean_redis, running_replicas
from tests.unit.gateway import test_response_store

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.9, ttft_ms: 2,
      tpot_ms: 1}}
"""
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
MAX_PROMPT_CHARS = 12_000


@dataclass
class Replicas:
    urls: list[str]
    backends: list[str]
    """The one backend each replica routes to."""
    prefix: str

    def create_key(self, **fields: Any) -> str:
        answer = httpx.post(
            self.urls[0] + "/admin/v1/keys",
            json={"name": "k-" + uuid.uuid4().hex[:6], **fields},
            headers={"authorization": f"Bearer {ADMIN_KEY}"},
        )
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])

    def client(self, i: int, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.urls[i] + "/v1", api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    spec = parse_fleet_spec(FLEET, "<responses fleet>")
    prefix = f"itest-resp-{uuid.uuid4().hex[:10]}"
    try:
        with Fleet(spec, log_dir=tmp_path_factory.mktemp("resp-fleet")) as fleet:
            configs, names = [], []
            for backend in fleet.backends:
                config: dict[str, Any] = fleet.gateway_config(
                    health={"interval": 0.5, "timeout": 0.5},
                    limits={"max_prompt_chars": MAX_PROMPT_CHARS},
                )
                pool = config["pools"][0]
                pool["backends"] = [b for b in pool["backends"] if b["name"] == backend.name]
                config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
                config["auth"] = {"mode": "keys"}
                config["batches"] = {"enabled": False}
                configs.append(config)
                names.append(backend.name)
            workdirs = [tmp_path_factory.mktemp(f"resp-gw-{n}") for n in range(len(configs))]
            with running_replicas(configs, workdirs, {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as urls:
                yield Replicas(urls, names, prefix)
    finally:
        clean_redis(prefix)


def stored_keys(prefix: str) -> set[bytes]:
    client = redis.Redis()
    try:
        return set(client.scan_iter(match=f"*syr:{prefix}*", count=1000))
    finally:
        client.close()


def test_follow_up_on_another_replica_and_backend_continues_the_conversation(replicas: Replicas) -> None:
    key = replicas.create_key()
    first = replicas.client(0, key).responses.with_raw_response.create(
        model=MODEL, input="Tell me about the sea.", max_output_tokens=8
    )
    assert first.headers["x-switchyard-backend"] == replicas.backends[0]
    assert first.headers["x-switchyard-response-stored"] == "true"
    answer = first.parse()
    assert answer.output_text and answer.usage is not None
    follow = replicas.client(1, key).responses.with_raw_response.create(
        model=MODEL, input="And about rivers?", previous_response_id=answer.id, max_output_tokens=8
    )
    assert follow.headers["x-switchyard-backend"] == replicas.backends[1]
    second = follow.parse()
    assert second.usage is not None
    assert second.previous_response_id == answer.id  # the client's, though the backend saw none
    assert replicas.client(0, key).responses.retrieve(second.id).previous_response_id == answer.id
    # The backend got the first turn's input and output before the new input.
    assert second.usage.input_tokens > answer.usage.input_tokens + answer.usage.output_tokens
    # A third turn chains through both.
    third = replicas.client(0, key).responses.create(
        model=MODEL, input="Thanks.", previous_response_id=second.id, max_output_tokens=4
    )
    assert third.usage is not None and third.usage.input_tokens > second.usage.input_tokens


def test_streamed_response_is_stored_before_it_ends(replicas: Replicas) -> None:
    key = replicas.create_key()
    with replicas.client(0, key).responses.stream(
        model=MODEL, input="Stream it.", max_output_tokens=6
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    # Sent the moment the stream ends, to the other replica: already stored.
    follow = replicas.client(1, key).responses.create(
        model=MODEL, input="More.", previous_response_id=final.id, max_output_tokens=4
    )
    assert follow.usage is not None and final.usage is not None
    assert follow.usage.input_tokens > final.usage.input_tokens
    fetched = replicas.client(1, key).responses.retrieve(final.id)
    assert fetched.id == final.id and fetched.output_text == final.output_text
    # A streamed follow-up: its events name the previous response, and it is stored the same way.
    with replicas.client(1, key).responses.stream(
        model=MODEL, input="Again.", previous_response_id=follow.id, max_output_tokens=4
    ) as stream:
        created = next(iter(stream))
        last = stream.get_final_response()
    assert created.type == "response.created" and created.response.previous_response_id == follow.id
    assert last.previous_response_id == follow.id
    assert replicas.client(0, key).responses.retrieve(last.id).previous_response_id == follow.id


def test_get_and_delete_see_only_the_keys_own_responses(replicas: Replicas) -> None:
    owner, other = replicas.create_key(), replicas.create_key()
    created = replicas.client(0, owner).responses.create(model=MODEL, input="mine", max_output_tokens=4)
    assert replicas.client(1, owner).responses.retrieve(created.id).id == created.id
    for i in (0, 1):
        with pytest.raises(openai.NotFoundError):
            replicas.client(i, other).responses.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            replicas.client(i, other).responses.delete(created.id)
        with pytest.raises(openai.BadRequestError) as caught:
            replicas.client(i, other).responses.create(
                model=MODEL, input="steal", previous_response_id=created.id, max_output_tokens=4
            )
        assert caught.value.code == "previous_response_not_found"
    # Still there for its owner after the other key's attempts; then deleted, and gone.
    assert replicas.client(0, owner).responses.retrieve(created.id).id == created.id
    deleted = httpx.delete(
        replicas.urls[1] + f"/v1/responses/{created.id}", headers={"authorization": f"Bearer {owner}"}
    )
    assert deleted.status_code == 200 and deleted.json() == {
        "id": created.id,
        "object": "response",
        "deleted": True,
    }
    with pytest.raises(openai.NotFoundError):
        replicas.client(0, owner).responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        replicas.client(0, owner).responses.delete(created.id)


def test_store_false_is_not_stored(replicas: Replicas) -> None:
    key = replicas.create_key()
    raw = replicas.client(0, key).responses.with_raw_response.create(
        model=MODEL, input="forget me", store=False, max_output_tokens=4
    )
    assert "x-switchyard-response-stored" not in raw.headers
    with pytest.raises(openai.NotFoundError):
        replicas.client(0, key).responses.retrieve(raw.parse().id)


def test_anonymous_and_unknown_keys_are_refused(replicas: Replicas) -> None:
    for path, method in (
        ("/v1/responses", "POST"),
        ("/v1/responses/resp_abc", "GET"),
        ("/v1/responses/resp_abc", "DELETE"),
    ):
        answer = httpx.request(method, replicas.urls[0] + path, json={"model": MODEL, "input": "x"})
        assert answer.status_code == 401, answer.text
        assert answer.json()["error"]["code"] == "invalid_api_key"
        wrong = httpx.request(
            method,
            replicas.urls[0] + path,
            json={"model": MODEL, "input": "x"},
            headers={"authorization": "Bearer sy-nope"},
        )
        assert wrong.status_code == 401


def test_hostile_inputs_are_openai_errors_and_change_nothing(replicas: Replicas) -> None:
    key = replicas.create_key()
    base = replicas.create_key()  # a response of another key, to see it untouched
    kept = replicas.client(0, base).responses.create(model=MODEL, input="keep", max_output_tokens=4)
    before = stored_keys(replicas.prefix)
    url = replicas.urls[0]
    auth = {"authorization": f"Bearer {key}"}
    cases: list[tuple[dict[str, Any] | bytes, int, str]] = [
        ({"model": MODEL, "input": "x", "previous_response_id": "../../etc/passwd"}, 400, "invalid_value"),
        ({"model": MODEL, "input": "x", "previous_response_id": "r" * 500}, 400, "invalid_value"),
        (
            {"model": MODEL, "input": "x", "previous_response_id": "resp_doesnotexist"},
            400,
            "previous_response_not_found",
        ),
        ({"model": MODEL, "input": "x", "previous_response_id": 7}, 400, "invalid_type"),
        ({"model": MODEL, "input": "x" * (MAX_PROMPT_CHARS + 1)}, 400, "invalid_value"),
        ({"model": MODEL, "input": []}, 400, "invalid_value"),
        ({"model": MODEL}, 400, "missing_required"),
        ({"model": "gpt-17", "input": "x"}, 404, "model_not_found"),
        (b'{"model": "', 400, "invalid_json"),
    ]
    for body, status, code in cases:
        if isinstance(body, bytes):
            answer = httpx.post(
                url + "/v1/responses", content=body, headers={**auth, "content-type": "application/json"}
            )
        else:
            answer = httpx.post(url + "/v1/responses", json=body, headers=auth)
        assert answer.status_code == status, (body, answer.text)
        error = answer.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == code, (body, error)
    # Grown past the bound by its earlier turns: refused too.
    long_turn = replicas.client(0, key).responses.create(
        model=MODEL, input="y" * (MAX_PROMPT_CHARS - 10), max_output_tokens=4
    )
    after_long = stored_keys(replicas.prefix)
    with pytest.raises(openai.BadRequestError) as caught:
        replicas.client(0, key).responses.create(
            model=MODEL, input="z" * 20, previous_response_id=long_turn.id, max_output_tokens=4
        )
    assert caught.value.code == "invalid_value" and "earlier turns" in caught.value.message
    for bad in ("..%2F..%2Fx", "a" * 300, "resp_nope"):
        for method in ("GET", "DELETE"):
            answer = httpx.request(method, url + f"/v1/responses/{bad}", headers=auth)
            assert answer.status_code == 404, (bad, answer.text)
            assert isinstance(answer.json()["error"]["code"], str)
    assert stored_keys(replicas.prefix) == after_long and before <= after_long
    assert replicas.client(1, base).responses.retrieve(kept.id).id == kept.id


def test_messages_key_errors_are_anthropic_shaped(replicas: Replicas) -> None:
    url = replicas.urls[0]
    body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    anonymous = httpx.post(url + "/v1/messages", json=body)
    assert anonymous.status_code == 401
    assert anonymous.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": anonymous.json()["error"]["message"]},
    }
    key = replicas.create_key(rpm=1)
    sdk = anthropic.Anthropic(base_url=url, api_key=key, max_retries=0)
    assert sdk.messages.create(model=MODEL, max_tokens=4, messages=body["messages"]).usage.output_tokens > 0
    with pytest.raises(anthropic.RateLimitError) as caught:
        sdk.messages.create(model=MODEL, max_tokens=4, messages=body["messages"])
    assert caught.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert caught.value.response.headers["x-ratelimit-limit-requests"] == "1"


def test_open_mode_memory_store_continues_and_isolates_by_bearer_token(env: Env) -> None:
    # The session gateway: no Redis, open mode, four backends spread by least-outstanding.
    alice = openai.OpenAI(
        base_url=env.base_url + "/v1", api_key="sk-alice-" + uuid.uuid4().hex, max_retries=0
    )
    bob = openai.OpenAI(base_url=env.base_url + "/v1", api_key="sk-bob-" + uuid.uuid4().hex, max_retries=0)
    first = alice.responses.create(model=MODEL, input="one", max_output_tokens=4)
    follow = alice.responses.create(
        model=MODEL, input="two", previous_response_id=first.id, max_output_tokens=4
    )
    assert first.usage is not None and follow.usage is not None
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert alice.responses.retrieve(follow.id).id == follow.id
    with pytest.raises(openai.NotFoundError):
        bob.responses.retrieve(follow.id)
    anonymous = httpx.get(env.base_url + f"/v1/responses/{follow.id}")
    assert anonymous.status_code == 404 and anonymous.json()["error"]["code"] == "not_found"


def test_the_response_store_on_a_redis_cluster(cluster_redis: RedisCluster) -> None:
    # Each key's three Redis keys share its hash tag: every script runs on the one node of that slot.
    async def run() -> None:
        for test in (
            test_response_store.test_a_key_reads_and_deletes_only_its_own,
            test_response_store.test_the_quota_drops_the_oldest_and_counts_bytes_exactly,
        ):
            client = redis_client(cluster_redis.url)
            store = RedisResponseStore(
                client, f"itest-resp-{uuid.uuid4().hex[:8]}", ttl_s=60, max_bytes_per_key=3000
            )
            try:
                await test(store)
            finally:
                await store.close()

    asyncio.run(run())


def test_too_long_for_every_backend_names_the_endpoints_prompt_parameter(env: Env) -> None:
    client = openai.OpenAI(base_url=env.base_url + "/v1", api_key="sk-long", max_retries=0)
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model=MODEL, input="x", max_output_tokens=100_000)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "input"
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt="x", max_tokens=100_000)
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=100_000
        )
    assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
