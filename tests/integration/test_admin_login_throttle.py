"""Guessing the admin key is slowed per client address, on the console login and the admin API, across
replicas (through Redis), without locking the real admin out from another address.

The attack reported: 300 wrong keys at 844/s on the console login, then the right one worked. The
gateways run for real (`switchyard serve`); the clients connect from different loopback addresses.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import clean_redis, running_replicas

ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
ATTACKER, OTHER_ATTACKER, ADMIN = "127.0.0.2", "127.0.0.3", "127.0.0.1"


def _config(prefix: str) -> dict:
    return {
        "gateway": {"health": {"interval": 60}},
        "ledger": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix},
        "telemetry": {"access_log": {"enabled": False}},
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"name": "h100-a", "url": "http://127.0.0.1:9", "models": ["m"], "max_model_len": 4096}
                ],
            }
        ],
    }


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    prefix = f"test-throttle-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    workdir: Path = tmp_path_factory.mktemp("throttle")
    try:
        with running_replicas(
            [_config(prefix)] * 2, [workdir / "a", workdir / "b"], {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
        ) as urls:
            yield urls
    finally:
        clean_redis(prefix)


def _client(base: str, source: str) -> httpx.Client:
    return httpx.Client(
        base_url=base, transport=httpx.HTTPTransport(local_address=source), trust_env=False, timeout=10
    )


def _login(client: httpx.Client, key: str) -> httpx.Response:
    origin = str(client.base_url).rstrip("/")
    return client.post("/console/login", data={"admin_key": key}, headers={"origin": origin})


def _failures(base: str, surface: str) -> float:
    for line in httpx.get(base + "/metrics", trust_env=False).text.splitlines():
        if line.startswith(f'switchyard_admin_auth_failures_total{{surface="{surface}"}} '):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no switchyard_admin_auth_failures_total for {surface}")


def test_300_wrong_console_logins_are_slowed_and_the_right_key_waits_only_at_that_address(
    replicas: list[str],
) -> None:
    a, b = replicas
    before = _failures(a, "console")
    statuses: list[int] = []
    started = time.monotonic()
    with _client(a, ATTACKER) as attacker:
        for i in range(300):
            statuses.append(_login(attacker, f"sy-guess-{i:04d}-{uuid.uuid4().hex}").status_code)
        elapsed = time.monotonic() - started
        checked = statuses.count(401)
        # Five free guesses, then one more per doubling wait (1 s, 2 s, 4 s, ...) while the loop runs.
        assert checked <= 5 + 2 + int(elapsed).bit_length(), (checked, elapsed)
        assert statuses.count(429) == 300 - checked
        refused = _login(attacker, ADMIN_KEY)
        assert refused.status_code == 429, "the right key is not even checked while the address waits"
        assert int(refused.headers["retry-after"]) >= 1
        assert "Too many failed logins" in refused.text
    with _client(b, ATTACKER) as attacker_elsewhere:
        assert _login(attacker_elsewhere, ADMIN_KEY).status_code == 429, "the other replica knows (Redis)"
    with _client(a, ADMIN) as admin, _client(b, ADMIN) as admin_b:
        assert _login(admin, ADMIN_KEY).status_code == 303, "the real admin, from another address, logs in"
        assert _login(admin_b, ADMIN_KEY).status_code == 303
    assert _failures(a, "console") - before == checked


def test_wrong_admin_api_keys_are_slowed_per_address(replicas: list[str]) -> None:
    a, b = replicas
    before = _failures(b, "admin_api")
    with _client(b, OTHER_ATTACKER) as attacker:
        answers = [
            attacker.get("/admin/v1/backends", headers={"authorization": f"Bearer sy-guess-{i}"})
            for i in range(40)
        ]
        statuses = [r.status_code for r in answers]
        assert statuses[:5] == [401] * 5 and statuses.count(401) <= 8
        throttled = next(r for r in answers if r.status_code == 429)
        assert throttled.json()["error"]["code"] == "too_many_failed_logins"
        assert int(throttled.headers["retry-after"]) >= 1
        right = attacker.get("/admin/v1/backends", headers={"authorization": f"Bearer {ADMIN_KEY}"})
        assert right.status_code == 429
    with _client(a, ADMIN) as admin:
        assert (
            admin.get("/admin/v1/backends", headers={"authorization": f"Bearer {ADMIN_KEY}"}).status_code
            == 200
        )
    assert _failures(b, "admin_api") - before == statuses.count(401)
