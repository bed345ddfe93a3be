"""The admin API on its own port, `switchyard keys|teams ...` against a running gateway, and the
`x-ratelimit-*` headers on every answer to a key (error answers included)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support import ROOT, RecordingBackend, free_port, running_gateway

MODEL = "llama-3.1-8b"
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@dataclass
class Gateway:
    public: str
    admin: str

    def admin_client(self) -> httpx.Client:
        return httpx.Client(base_url=self.admin, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)

    def create_key(self, **fields: Any) -> tuple[str, str]:
        with self.admin_client() as client:
            answer = client.post("/admin/v1/keys", json=fields)
        assert answer.status_code == 201, answer.text
        return answer.json()["key"], answer.json()["id"]


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
                    "backends": [{"url": backend.url, "models": [MODEL], "max_model_len": 4096}],
                }
            ],
        }
        workdir = tmp_path_factory.mktemp("gw-admin")
        with running_gateway(config, workdir, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as public:
            yield Gateway(public, f"http://127.0.0.1:{admin_port}")


def test_admin_api_only_on_the_admin_port_and_the_api_only_on_the_public_one(gateway: Gateway) -> None:
    auth = {"authorization": f"Bearer {ADMIN_KEY}"}
    on_public = httpx.get(gateway.public + "/admin/v1/keys", headers=auth)
    assert on_public.status_code == 404 and on_public.json()["error"]["message"].startswith("Unknown path")
    assert httpx.post(gateway.public + "/admin/v1/backends/h100-1/drain", headers=auth).status_code == 404
    assert httpx.get(gateway.admin + "/admin/v1/keys", headers=auth).status_code == 200
    assert httpx.get(gateway.admin + "/admin/v1/keys").status_code == 401  # the guard still holds
    key, _ = gateway.create_key(name="api")
    tenant = {"authorization": f"Bearer {key}"}
    assert httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=tenant).status_code == 200
    assert httpx.post(gateway.admin + "/v1/chat/completions", json=CHAT, headers=tenant).status_code == 404
    for path in ("/health", "/ready", "/metrics"):
        for base in (gateway.public, gateway.admin):
            assert httpx.get(base + path).status_code == 200, (base, path)


def _cli(gateway: Gateway, *args: str, key: str | None = ADMIN_KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_ADMIN_KEY"}
    if key is not None:
        env["SWITCHYARD_ADMIN_KEY"] = key
    command = [sys.executable, "-m", "gateway.cli", *args[:2], "--url", gateway.admin, *args[2:]]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_keys_and_teams_cli_end_to_end(gateway: Gateway) -> None:
    made = _cli(gateway, "keys", "create", "--name", "cli-made", "--team", "research", "--rpm", "50")
    assert made.returncode == 0, made.stderr
    material = next(line.split()[1] for line in made.stdout.splitlines() if line.startswith("key: sy-"))
    key_id = next(word for word in made.stdout.split() if word.startswith("key_"))
    assert "cli-made" in made.stdout and "research" in made.stdout
    chat = {"authorization": f"Bearer {material}"}
    assert httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=chat).status_code == 200

    listed = _cli(gateway, "keys", "list", "--team", "research")
    assert listed.returncode == 0 and key_id in listed.stdout and material not in listed.stdout
    assert listed.stdout.splitlines()[0].split()[:3] == ["id", "name", "team"]

    updated = _cli(gateway, "keys", "update", key_id, "--tpm", "900", "--clear", "rpm", "--json")
    body = json.loads(updated.stdout)
    assert body["tpm"] == 900 and "rpm" not in body and "hash" not in body
    shown = json.loads(_cli(gateway, "keys", "show", key_id, "--json").stdout)
    assert shown["tpm"] == 900 and "spent_usd" in shown

    rotated = _cli(gateway, "keys", "rotate", key_id, "--json")
    fresh = json.loads(rotated.stdout)["key"]
    assert fresh != material
    answer = httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=chat)
    assert answer.status_code == 401
    fresh_auth = {"authorization": f"Bearer {fresh}"}
    assert (
        httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=fresh_auth).status_code == 200
    )

    revoked = _cli(gateway, "keys", "revoke", key_id)
    assert revoked.returncode == 0 and "revoked" in revoked.stdout
    answer = httpx.post(gateway.public + "/v1/chat/completions", json=CHAT, headers=fresh_auth)
    assert answer.status_code == 401

    assert _cli(gateway, "teams", "set", "research", "--rpm", "10", "--budget-usd", "5").returncode == 0
    teams = _cli(gateway, "teams", "list")
    assert "research" in teams.stdout and "10" in teams.stdout
    assert json.loads(_cli(gateway, "teams", "show", "research", "--json").stdout)["budget_usd"] == 5
    assert _cli(gateway, "teams", "delete", "research").returncode == 0
    assert _cli(gateway, "teams", "show", "research").returncode == 1

    anonymous = _cli(gateway, "keys", "list", key=None)
    assert anonymous.returncode == 1 and "SWITCHYARD_ADMIN_KEY" in anonymous.stderr
    wrong = _cli(gateway, "keys", "list", key="sy-not-a-key")
    assert wrong.returncode == 1 and "401" in wrong.stderr


def test_rate_limit_headers_on_error_answers_too(gateway: Gateway) -> None:
    key, _ = gateway.create_key(name="headers", rpm=1000, tpm=100_000, models=[MODEL])
    auth = {"authorization": f"Bearer {key}"}
    url = gateway.public + "/v1/chat/completions"
    # Before any admission of this key here: the bare limits.
    first = httpx.post(url, json={"model": MODEL}, headers=auth)  # no messages: 400
    assert first.status_code == 400
    assert first.headers["x-ratelimit-limit-requests"] == "1000"
    assert first.headers["x-ratelimit-limit-tokens"] == "100000"
    ok = httpx.post(url, json=CHAT, headers=auth)
    assert ok.status_code == 200 and ok.headers["x-ratelimit-remaining-requests"] == "999"
    for body in ({"model": MODEL}, {**CHAT, "model": "not-allowed"}):
        answer = httpx.post(url, json=body, headers=auth)
        assert answer.status_code in (400, 403), answer.text
        assert answer.headers["x-ratelimit-limit-requests"] == "1000"
        assert answer.headers["x-ratelimit-remaining-requests"] == "999"
        assert answer.headers["x-ratelimit-reset-requests"].endswith("s")
        assert answer.headers["x-ratelimit-remaining-tokens"]


def test_the_cli_parsers_need_no_server(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "keys", "update", "key_x", "--clear", "name"],
        cwd=ROOT,
        env={**os.environ, "SWITCHYARD_ADMIN_KEY": "sy-x"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cannot be cleared" in done.stderr
