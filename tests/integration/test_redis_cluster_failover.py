"""Two keyed gateway replicas on a Redis Cluster with replicas, through the OpenAI SDK, while the primary
serving the deployment fails over: first a manual `CLUSTER FAILOVER`, then that primary SIGKILLed (its
replica is promoted after `cluster-node-timeout`, 1 s here).

The deployment's prefix is chosen so that all three hash tags (ledger and fleet view, keys and limits,
batches) live on one primary: its loss takes every component's Redis away at once. Requests run all the
while. With `auth.redis_away: fail_open` a key without a budget is admitted from the replica's local share
throughout, and a budgeted key is refused with 503 `limits_unavailable` only while no primary serves the
slot; no other failure is allowed. Afterwards the ledger has counted every answered request (it buffered
them), and rate limits, budgets, revocation and the fleet view's drains work again.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from redis.crc import key_slot

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.integration.test_redis_cluster import (
    ADMIN_KEY,
    FLEET,
    Deployment,
    _wait_for,
    limits_and_fleet_view_work,
    replica_configs,
)
from tests.integration.test_tenants import _call
from tests.redis_cluster import RedisCluster
from tests.support import running_replicas

GAP_LIMIT_S = 10.0
"""A budgeted key is served again within this long of the primary's death (measured: about 2-3 s)."""


def _prefix_on_one_node(redis: RedisCluster) -> str:
    """A key prefix whose three hash tags are served by one primary. CRC16 never puts `{sy:P}` with
    `{syt:P}` in one of three equal ranges, so the ledger's slot is moved to the primary of the other two."""
    ranges = redis.owners()

    def owner(tag: str) -> int:
        slot = key_slot(tag.encode())
        return next(port for first, last, port in ranges if first <= slot <= last)

    while True:
        prefix = f"itest-fo-{uuid.uuid4().hex[:8]}"
        if owner("{syt:" + prefix + "}") == owner("{syb:" + prefix + "}"):
            break
    redis.move_slot(key_slot(("{sy:" + prefix + "}").encode()), owner("{syt:" + prefix + "}"))
    return prefix


@dataclass
class Seeded(Deployment):
    seed: int
    """The port of the one startup node in the gateways' `redis+cluster://` URL."""


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, cluster_redis_replicated: RedisCluster
) -> Iterator[Seeded]:
    redis = cluster_redis_replicated
    spec = parse_fleet_spec(FLEET, "<cluster fleet>")
    prefix = _prefix_on_one_node(redis)
    # The one startup node the gateways are given is the primary that will die (the replica that the
    # manual failover promotes): afterwards they must find the cluster through the nodes they learned.
    seed = redis.replica_of(key_slot(("{syt:" + prefix + "}").encode()))
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("fo-fleet")) as fleet:
        configs = replica_configs(fleet, f"redis+cluster://127.0.0.1:{seed}", prefix)
        workdirs = [tmp_path_factory.mktemp(f"fo-gw-{n}") for n in "ab"]
        with running_replicas(configs, workdirs, {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as urls:
            yield Seeded(redis, urls, prefix, [w / "gateway.log" for w in workdirs], seed)


@dataclass
class Traffic:
    """Requests sent one after another, alternating replicas, with a key without a budget (`steady`)
    and one with a budget (`paying`), each outcome timed."""

    deployment: Deployment
    steady: str
    paying: str
    outcomes: list[tuple[float, str, str]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)

    def _run(self) -> None:
        urls = self.deployment.urls
        i = 0
        while not self._stop.is_set():
            for kind, key in (("steady", self.steady), ("paying", self.paying)):
                self.outcomes.append((time.monotonic(), kind, _call(urls[i % 2], key, stream=i % 3 == 0)))
                i += 1
            time.sleep(0.02)

    def served_since(self, since: float, kind: str) -> bool:
        return any(t > since and k == kind and o == "ok" for t, k, o in list(self.outcomes))

    def count(self, kind: str, outcome: str = "ok") -> int:
        return sum(k == kind and o == outcome for _, k, o in self.outcomes)


def _rides_out(deployment: Deployment, label: str, fail_over: Any) -> float:
    """Traffic before, during and after `fail_over()` (which returns when it started); the gap: from
    then to the first budgeted request served again."""
    steady, steady_id = deployment.create_key(name=f"{label}-steady")
    paying, paying_id = deployment.create_key(name=f"{label}-paying", budget_usd=100.0)
    with Traffic(deployment, steady, paying) as traffic:
        _wait_for(lambda: traffic.served_since(0.0, "paying"), f"{label}: no traffic before", 10.0)
        started = fail_over()
        _wait_for(lambda: traffic.served_since(started, "paying"), f"{label}: not served again", GAP_LIMIT_S)
        back = next(t for t, k, o in list(traffic.outcomes) if t > started and k == "paying" and o == "ok")
        time.sleep(1.0)  # and some traffic after
    outcomes = {(k, o) for _, k, o in traffic.outcomes}
    # A key without a budget is admitted from the local share while Redis is away: never refused. A
    # budgeted key is refused with a clear 503 only while no primary serves the slot.
    assert outcomes <= {("steady", "ok"), ("paying", "ok"), ("paying", "503:limits_unavailable")}, outcomes
    refused = [t for t, k, o in traffic.outcomes if o != "ok"]
    assert all(started - 0.5 < t < back for t in refused), (started, back, refused)
    # The ledger buffered what it could not write, and counted every answered request once.
    for key_id, kind in ((steady_id, "steady"), (paying_id, "paying")):
        want = traffic.count(kind)
        _wait_for(lambda k=key_id, w=want: deployment.requests_of(k) == w, f"{label}: {kind} not counted", 10)
    return back - started


def _sync(url: str) -> str:
    return str(httpx.get(url + "/ready", timeout=5).json()["fleet"]["sync"])


def _limits_and_fleet_view_work(deployment: Deployment, label: str) -> None:
    # The fleet view's pub/sub is subscribed again (on a live node) on both replicas.
    _wait_for(
        lambda: all(_sync(url) == "connected" for url in deployment.urls),
        f"{label}: fleet sync not back",
        5.0,
    )
    limits_and_fleet_view_work(deployment, label)


def test_a_manual_failover_fails_no_request(deployment: Deployment) -> None:
    redis = deployment.redis
    slot = key_slot(("{syt:" + deployment.prefix + "}").encode())
    before = redis.owner(slot)

    def fail_over() -> float:
        started = time.monotonic()
        redis.failover(slot)
        return started

    gap = _rides_out(deployment, "manual", fail_over)
    assert redis.owner(slot) != before
    print(f"manual failover: budgeted requests served again {gap:.2f} s after it began")
    _limits_and_fleet_view_work(deployment, "manual")


def test_the_death_of_a_primary_is_bounded(deployment: Seeded) -> None:
    redis = deployment.redis
    slot = key_slot(("{syt:" + deployment.prefix + "}").encode())
    dead = redis.owner(slot)

    assert dead == deployment.seed  # the gateways' only startup node

    def kill() -> float:
        started = time.monotonic()
        redis.kill(dead)
        return started

    gap = _rides_out(deployment, "killed", kill)
    assert redis.promoted(slot, dead) != dead
    print(f"primary killed: budgeted requests served again {gap:.2f} s after its death")
    _limits_and_fleet_view_work(deployment, "killed")


def test_no_traceback_in_the_gateways_logs(deployment: Deployment) -> None:
    for log in deployment.logs:
        assert "Traceback" not in log.read_text(), log
