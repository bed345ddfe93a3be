"""What a new user meets first, through the OpenAI SDK and plain HTTP against a running gateway:
model cards, validation codes, the /metrics header, and /ready when every backend is drained."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from tests.support import RecordingBackend, free_port, running_gateway

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@dataclass
class Gateway:
    base_url: str
    backends: list[RecordingBackend]

    @property
    def sdk(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.base_url + "/v1", api_key="sk-test", max_retries=0)

    def forwarded(self) -> int:
        return sum(len(b.requests) for b in self.backends)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with RecordingBackend(MODEL) as first, RecordingBackend(MODEL) as second:
        config = {
            "pools": [
                {
                    "name": "h100",
                    "vendor": "nvidia",
                    "accelerator": "h100",
                    "price_per_gpu_hour": 2.9,
                    "backends": [
                        {"name": f"rec-{i}", "url": b.url, "models": [MODEL], "max_model_len": 4096}
                        for i, b in enumerate((first, second))
                    ],
                }
            ],
            "ledger": {"store": "memory"},
        }
        workdir: Path = tmp_path_factory.mktemp("first-use")
        with running_gateway(config, workdir) as base_url:
            yield Gateway(base_url, [first, second])


def test_models_retrieve_returns_the_model_card(gateway: Gateway) -> None:
    card = gateway.sdk.models.retrieve(MODEL)  # the SDK sends the slash as %2F
    assert (card.id, card.object, card.owned_by) == (MODEL, "model", "switchyard")
    assert card.created > 0
    listed = {m.id: m for m in gateway.sdk.models.list()}
    assert card.model_dump() == listed[MODEL].model_dump()
    plain = httpx.get(f"{gateway.base_url}/v1/models/{MODEL}")  # curl-style, slash unencoded
    assert plain.status_code == 200 and plain.json()["id"] == MODEL


def test_models_retrieve_of_an_unknown_model_is_openais_404(gateway: Gateway) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        gateway.sdk.models.retrieve("gpt-unknown")
    assert caught.value.code == "model_not_found"
    body = caught.value.response.json()["error"]
    assert body["type"] == "invalid_request_error" and body["param"] == "model"
    assert "gpt-unknown" in body["message"]


def test_metrics_content_type_has_one_charset(gateway: Gateway) -> None:
    response = httpx.get(gateway.base_url + "/metrics")
    assert response.status_code == 200
    assert response.headers.get_list("content-type") == ["text/plain; version=0.0.4; charset=utf-8"]


def test_negative_max_tokens_is_invalid_value(gateway: Gateway) -> None:
    before = gateway.forwarded()
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=-5
        )
    assert caught.value.code == "invalid_value"
    assert caught.value.response.json()["error"]["param"] == "max_tokens"
    assert gateway.forwarded() == before


@pytest.mark.parametrize("empty", [[], ""], ids=["list", "string"])
def test_empty_embeddings_input_is_refused_by_the_gateway(gateway: Gateway, empty: list[str] | str) -> None:
    before = gateway.forwarded()
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.sdk.embeddings.create(model=MODEL, input=empty)
    error = caught.value.response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_value", "input")
    assert error["type"] == "invalid_request_error"
    assert gateway.forwarded() == before


def test_ready_when_every_backend_is_drained(gateway: Gateway) -> None:
    names = ["rec-0", "rec-1"]
    ready = httpx.get(gateway.base_url + "/ready").json()
    assert ready["status"] == "ready"
    assert (ready["backends_serving"], ready["backends_healthy"], ready["backends_drained"]) == (2, 2, 0)
    assert "reason" not in ready
    try:
        for name in names:
            httpx.post(f"{gateway.base_url}/admin/v1/backends/{name}/drain").raise_for_status()
        response = httpx.get(gateway.base_url + "/ready")
        ready = response.json()
        assert response.status_code == 503 and ready["status"] == "not ready"
        assert ready["backends_healthy"] == 2  # they still pass their health check
        assert ready["backends_drained"] == 2
        assert ready["backends_serving"] == 0
        assert ready["backends_total"] == 2
        assert ready["reason"].startswith("all drained")
    finally:
        for name in names:
            httpx.post(f"{gateway.base_url}/admin/v1/backends/{name}/undrain").raise_for_status()
    assert httpx.get(gateway.base_url + "/ready").status_code == 200


@pytest.mark.parametrize("spill", [True, False], ids=["spilled", "spill-off"])
def test_shutdown_with_redis_away_says_what_became_of_the_record(tmp_path: Path, spill: bool) -> None:
    """One line says what happened to a record Redis never got: kept in the spill file for the next start
    (the default), or, with spilling off, lost."""
    redis_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    spill_file = tmp_path / "ledger.spill"
    with RecordingBackend(MODEL) as backend:
        config = {
            "pools": [
                {
                    "name": "h100",
                    "vendor": "nvidia",
                    "accelerator": "h100",
                    "price_per_gpu_hour": 2.9,
                    "backends": [{"url": backend.url, "models": [MODEL], "max_model_len": 4096}],
                }
            ],
            "ledger": {
                "store": "redis",
                "redis_url": redis_url,
                "redis_timeout": 0.2,
                "spill": spill,
                "spill_path": str(spill_file),
            },
        }
        with running_gateway(config, tmp_path) as base_url:
            sdk = openai.OpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0)
            sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    log = (tmp_path / "gateway.log").read_text()
    said = [line for line in log.splitlines() if "ledger" in line and "shutdown" in line]
    assert len(said) == 1, log
    if spill:
        assert f"1 record kept in {spill_file} and written to Redis at the next start" in said[0], said
        assert spill_file.stat().st_size > 0
    else:
        assert "1 record could not be written to Redis at shutdown and is lost" in said[0], said
    assert "ledger flushed" not in log
