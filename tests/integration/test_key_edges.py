"""Issue 33's trust holes at the edge of a real gateway in `auth.mode: keys` (admin API on its own port):
hints above a key, two credential headers, reads without a key, per-key metrics, repeated query values."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.support import RecordingBackend, free_port, running_gateway

MODEL = "llama-3.1-8b"
OTHER = "qwen-2.5-7b"
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass
class Gateway:
    public: str
    admin: str

    def create_key(self, **fields: Any) -> str:
        auth = {"authorization": f"Bearer {ADMIN_KEY}"}
        answer = httpx.post(self.admin + "/admin/v1/keys", json=fields, headers=auth, timeout=10)
        assert answer.status_code == 201, answer.text
        return str(answer.json()["key"])


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    admin_port = free_port()
    with RecordingBackend(MODEL) as backend:
        config = {
            "gateway": {"admin_port": admin_port},
            "auth": {"mode": "keys", "store": "memory"},
            "pools": [
                {
                    "name": "h100",
                    "vendor": "nvidia",
                    "accelerator": "h100",
                    "price_per_gpu_hour": 2.9,
                    "backends": [{"url": backend.url, "models": [MODEL, OTHER], "max_model_len": 4096}],
                }
            ],
        }
        workdir = tmp_path_factory.mktemp("gw-key-edges")
        with running_gateway(config, workdir, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as public:
            yield Gateway(public, f"http://127.0.0.1:{admin_port}")


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


# --- item 2: a key's hints ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "said"),
    [("x-switchyard-priority", "priority"), ("x-request-priority", "x-request-priority")],
)
def test_a_hint_above_the_key_does_not_raise_its_class(gateway: Gateway, header: str, said: str) -> None:
    key = gateway.create_key(max_priority="low", classes=["batch"])
    answer = httpx.post(
        gateway.public + "/v1/chat/completions", json=CHAT, headers={**_bearer(key), header: "high"}
    )
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-switchyard-route"] == "balanced/batch"
    assert answer.headers["x-switchyard-hints-ignored"] == said


# --- item 7: one credential header --------------------------------------------------------------------


def test_two_authorization_headers_answer_400_on_every_route(gateway: Gateway) -> None:
    key = gateway.create_key(name="twice")
    twice = [("authorization", f"Bearer {key}"), ("authorization", f"Bearer {ADMIN_KEY}")]
    routes = [
        ("POST", gateway.public, "/v1/chat/completions"),
        ("POST", gateway.public, "/v1/embeddings"),
        ("GET", gateway.public, "/v1/models"),
        ("GET", gateway.public, f"/v1/models/{MODEL}"),
        ("GET", gateway.public, "/v1/batches"),
        ("GET", gateway.public, "/v1/files/file-nope"),
        ("GET", gateway.admin, "/admin/v1/keys"),
        ("GET", gateway.admin, "/admin/v1/usage?by=key"),
        ("GET", gateway.admin, "/console/login"),
        ("GET", gateway.admin, "/console/fleet"),
    ]
    for method, base, path in routes:
        for headers in (twice, [*twice[:1], ("x-api-key", "a"), ("x-api-key", "b")]):
            answer = httpx.request(
                method, base + path, headers=headers, json=CHAT if method == "POST" else None
            )
            assert answer.status_code == 400, (path, answer.status_code, answer.text)
            error = answer.json()["error"]
            assert error["code"] == "duplicate_header" and error["type"] == "invalid_request_error", error
            assert error["param"] in ("authorization", "x-api-key")
    one = httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=twice[:1])
    assert one.status_code == 200


# --- item 8: reads without a key, per-key metrics, repeated query values --------------------------------


def test_models_need_a_key_and_list_only_what_it_may_use(gateway: Gateway) -> None:
    for path in ("/v1/models", f"/v1/models/{MODEL}"):
        answer = httpx.get(gateway.public + path)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key", path
    narrow = _bearer(gateway.create_key(models=[MODEL]))
    listed = httpx.get(gateway.public + "/v1/models", headers=narrow)
    assert listed.status_code == 200 and [m["id"] for m in listed.json()["data"]] == [MODEL]
    assert httpx.get(gateway.public + f"/v1/models/{MODEL}", headers=narrow).json()["id"] == MODEL
    hidden = httpx.get(gateway.public + f"/v1/models/{OTHER}", headers=narrow)
    assert hidden.status_code == 404 and hidden.json()["error"]["code"] == "model_not_found"
    every = _bearer(gateway.create_key(name="every model"))
    assert {m["id"] for m in httpx.get(gateway.public + "/v1/models", headers=every).json()["data"]} == {
        MODEL,
        OTHER,
    }
    assert httpx.get(gateway.public + f"/v1/models/{OTHER}", headers=every).status_code == 200


def test_per_key_metrics_only_on_the_admin_port(gateway: Gateway) -> None:
    key = gateway.create_key(name="budgeted", budget_usd=5.0)
    answer = httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=_bearer(key))
    assert answer.status_code == 200
    on_admin = httpx.get(gateway.admin + "/metrics").text
    on_public = httpx.get(gateway.public + "/metrics").text
    assert 'switchyard_budget_used_ratio{scope="k:' in on_admin
    assert "switchyard_budget_used_ratio" not in on_public and "k:key_" not in on_public
    assert "switchyard_tenant_admissions_total" in on_public  # the aggregate stays


def test_a_repeated_query_parameter_is_refused(gateway: Gateway) -> None:
    tenant = _bearer(gateway.create_key(name="reader"))
    for path in ("/admin/v1/usage", "/admin/v1/costs"):
        answer = httpx.get(gateway.admin + path + "?by=key&by=backend", headers=tenant)
        assert answer.status_code == 400, (path, answer.text)
        assert answer.json()["error"]["code"] == "duplicate_parameter"
        assert httpx.get(gateway.admin + path + "?by=key", headers=tenant).status_code == 200
        admin = httpx.get(gateway.admin + path + "?by=key&by=backend", headers=_bearer(ADMIN_KEY))
        assert admin.status_code == 400
