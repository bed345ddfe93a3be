"""Two gateway replicas on a real three-node Redis Cluster (`redis+cluster://`), through the OpenAI SDK.

Every component that uses Redis is exercised once: keys and their limits (the raw script client and the
store), the ledger, the fleet view (a drain and its pub/sub), and batches. Then the slots of the
deployment's hash tags are migrated to other nodes and the same things keep working: the clients follow
the redirection instead of failing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from redis.crc import key_slot

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.integration.test_batches import _line, _upload, _wait
from tests.integration.test_tenants import _call
from tests.redis_cluster import RedisCluster
from tests.support import running_replicas

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 2, price_per_gpu_hour: 2.90, ttft_ms: 2,
      tpot_ms: 1}}
"""
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
WINDOW_S = 30


@dataclass
class Deployment:
    redis: RedisCluster
    urls: list[str]
    prefix: str
    logs: list[Path]

    def admin(self, i: int = 0) -> httpx.Client:
        headers = {"authorization": f"Bearer {ADMIN_KEY}"}
        return httpx.Client(base_url=self.urls[i], headers=headers, timeout=10)

    def create_key(self, **fields: Any) -> tuple[str, str]:
        with self.admin() as client:
            answer = client.post("/admin/v1/keys", json=fields)
        assert answer.status_code == 201, answer.text
        return answer.json()["key"], answer.json()["id"]

    def requests_of(self, key_id: str) -> int:
        with self.admin(1) as client:
            answer = client.get("/admin/v1/usage", params={"by": "key", "key": key_id})
        assert answer.status_code == 200, answer.text
        rows = answer.json()["data"]
        return int(rows[0]["requests"]) if rows else 0

    def tags(self) -> list[str]:
        return ["{sy:" + self.prefix + "}", "{syt:" + self.prefix + "}", "{syb:" + self.prefix + "}"]


def replica_configs(fleet: Fleet, redis_url: str, prefix: str) -> list[dict[str, Any]]:
    """The configs of two gateway replicas in keys mode sharing the ledger and counters on `redis_url`."""
    configs = []
    for _ in range(2):
        config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
        config["gateway"] = {**config.get("gateway", {}), "shutdown_grace": 1.0}
        config["ledger"] = {
            "redis_url": redis_url,
            "key_prefix": prefix,
            "flush_interval": 0.05,
            "refresh_interval": 0.3,
            "spill": False,
        }
        config["auth"] = {"mode": "keys", "window_s": WINDOW_S, "replicas": 2, "redis_timeout": 1.0}
        configs.append(config)
    return configs


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory, cluster_redis: RedisCluster) -> Iterator[Deployment]:
    spec = parse_fleet_spec(FLEET, "<cluster fleet>")
    prefix = f"itest-rc-{uuid.uuid4().hex[:8]}"
    files = tmp_path_factory.mktemp("rc-batch-files")
    redis = cluster_redis
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("rc-fleet")) as fleet:
        configs = replica_configs(fleet, redis.url, prefix)
        for config in configs:
            config["batches"] = {"directory": str(files), "lease_s": 1.5}
        workdirs = [tmp_path_factory.mktemp(f"rc-gw-{n}") for n in "ab"]
        with running_replicas(configs, workdirs, {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as urls:
            yield Deployment(redis, urls, prefix, [w / "gateway.log" for w in workdirs])


def _wait_for(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _draining(url: str, name: str) -> bool:
    rows = httpx.get(url + "/admin/v1/backends", headers={"authorization": f"Bearer {ADMIN_KEY}"}).json()
    return bool(next(r for r in rows["data"] if r["name"] == name)["draining"])


def limits_and_fleet_view_work(deployment: Deployment, label: str) -> None:
    """Budgets, a shared rate limit, revocation and a drain, between the deployment's two replicas."""
    urls = deployment.urls
    # A budget is answered only through the shared counters (the script client's round trip): a key
    # whose budget cannot pay one request is refused on both replicas.
    poor, _ = deployment.create_key(name=f"{label}-poor", budget_usd=1e-9)
    assert [_call(url, poor) for url in urls] == ["insufficient_quota"] * 2
    # A request rate shared by both replicas.
    limited, _ = deployment.create_key(name=f"{label}-rpm", rpm=4)
    left = WINDOW_S - time.time() % WINDOW_S  # windows start at multiples of window_s
    if left < 5:
        time.sleep(left + 0.05)  # all seven requests in one window
    outcomes = [_call(urls[i % 2], limited) for i in range(7)]
    assert outcomes.count("ok") == 4 and outcomes.count("rate_limit_exceeded") == 3, outcomes
    # Revocation reaches the other replica.
    revoked, revoked_id = deployment.create_key(name=f"{label}-revoked")
    assert _call(urls[1], revoked) == "ok"
    with deployment.admin(0) as admin:
        assert admin.post(f"/admin/v1/keys/{revoked_id}/revoke").status_code == 200
    _wait_for(lambda: _call(urls[1], revoked) == "401:invalid_api_key", f"{label}: revocation not seen")
    # The fleet view: a drain on one replica applies on the other (pub/sub, or the re-read).
    with deployment.admin(0) as admin:
        name = admin.get("/admin/v1/backends").json()["data"][0]["name"]
        assert admin.post(f"/admin/v1/backends/{name}/drain").json()["draining"]
    _wait_for(lambda: _draining(urls[1], name), f"{label}: the drain did not reach replica B", 2.0)
    with deployment.admin(1) as admin:
        assert not admin.post(f"/admin/v1/backends/{name}/undrain").json()["draining"]
    _wait_for(lambda: not _draining(urls[0], name), f"{label}: the undrain did not reach replica A", 2.0)


def _checks_every_component(deployment: Deployment, label: str) -> None:
    urls = deployment.urls
    # Keys and the ledger: requests on both replicas succeed and are counted once each.
    key, key_id = deployment.create_key(name=f"{label}-usage", budget_usd=100.0)
    for i in range(6):
        assert _call(urls[i % 2], key, stream=i % 3 == 0) == "ok"
    _wait_for(lambda: deployment.requests_of(key_id) == 6, f"{label}: the ledger did not count 6 requests")
    limits_and_fleet_view_work(deployment, label)
    # A batch, created on one replica, runs (leases and counters in Redis) and is seen from the other.
    sdk = openai.OpenAI(base_url=urls[0] + "/v1", api_key=key, max_retries=0, timeout=30)
    file_id = _upload(sdk, [_line(f"{label}-{i}") for i in range(4)])
    batch = sdk.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    done = _wait(sdk, batch.id, {"completed", "failed", "expired"}, timeout=30)
    assert done.status == "completed" and done.request_counts is not None, done
    assert done.request_counts.completed == 4, done.request_counts
    other = openai.OpenAI(base_url=urls[1] + "/v1", api_key=key, max_retries=0, timeout=30)
    assert other.batches.retrieve(batch.id).status == "completed"


def test_every_redis_component_works_on_a_cluster(deployment: Deployment) -> None:
    _checks_every_component(deployment, "first")


def test_each_hash_tag_lives_in_one_slot(deployment: Deployment) -> None:
    found = deployment.redis.slot_keys(f"*{deployment.prefix}*")
    assert found, "the gateways wrote nothing to the cluster"
    for tag in deployment.tags():
        slots = {slot for slot, keys in found.items() for key in keys if key.startswith(tag.encode())}
        assert slots == {key_slot(tag.encode())}, (tag, slots)
    every = {key for keys in found.values() for key in keys}
    assert all(key.decode().startswith(tuple(deployment.tags())) for key in every), every


def test_the_gateway_follows_its_slots_to_other_nodes(deployment: Deployment) -> None:
    redis = deployment.redis
    for tag in deployment.tags():
        slot = key_slot(tag.encode())
        before = redis.owner(slot)
        redis.move_slot(slot, next(p for p in redis.ports if p != before))
        assert redis.owner(slot) != before
    _checks_every_component(deployment, "moved")
    # Nothing was lost or stranded on the old nodes: every key is on its slot's new owner.
    for slot, keys in redis.slot_keys(f"*{deployment.prefix}*").items():
        owner = redis.node(redis.owner(slot))
        assert all(owner.exists(key) for key in keys), (slot, keys)


def test_no_cluster_error_in_the_gateways_logs(deployment: Deployment) -> None:
    for log in deployment.logs:
        text = log.read_text()
        for error in ("CROSSSLOT", "MOVED", "non local key", "Traceback"):
            assert error not in text, (log, error)
