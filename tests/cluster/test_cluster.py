"""Several replicas behind HAProxy behave as one gateway: a drain anywhere applies everywhere within a
second, a replica killed under load fails only what it was serving and loses no ledger record of what
it had answered, and a rolling restart fails nothing."""

from __future__ import annotations

import signal
import time

import httpx
import redis

from gateway.cli.cluster import Cluster
from tests.cluster.conftest import MODEL, Load
from tests.support import metric, sim_metrics

BODY = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _backend_url(cluster: Cluster, name: str) -> str:
    rows = httpx.get(cluster.replica_url(0) + "/admin/v1/backends", trust_env=False).json()["data"]
    return next(r["url"] for r in rows if r["name"] == name)


def _served(url: str) -> float:
    return metric(sim_metrics(url), "vllm:request_success_total")


def _draining(cluster: Cluster, replica: int, name: str) -> bool:
    rows = httpx.get(cluster.replica_url(replica) + "/admin/v1/backends", trust_env=False).json()["data"]
    return bool(next(r for r in rows if r["name"] == name)["draining"])


def _unrecorded(cluster: Cluster, ids: list[str]) -> list[str]:
    client = redis.Redis.from_url(cluster.redis_url or "")
    try:
        tag = "{sy:" + cluster.key_prefix + "}"
        exists = client.pipeline(transaction=False)
        for request_id in ids:
            exists.exists(f"{tag}:req:{request_id}")
        return [i for i, found in zip(ids, exists.execute(), strict=True) if not found]
    finally:
        client.close()


def _balancer_log_size(cluster: Cluster) -> int:
    return (cluster.workdir / "balancer.log").stat().st_size


def _balancer_retries(cluster: Cluster, since: int) -> int:
    """Requests HAProxy logged (it logs only what was not normal) with a retry or a redispatch since
    offset `since` of balancer.log: the `actconn/feconn/beconn/srv_conn/retries` field, retries non-zero."""
    with (cluster.workdir / "balancer.log").open("rb") as log:
        log.seek(since)
        lines = log.read().decode(errors="replace").splitlines()
    fields = (line.split() for line in lines if '"POST /v1/' in line)
    return sum(1 for f in fields if len(f) > 10 and f[10].rsplit("/", 1)[-1].lstrip("+") not in ("", "0"))


def test_drain_on_one_replica_stops_traffic_from_all_within_a_second(cluster: Cluster) -> None:
    name = "h100-0"
    url = _backend_url(cluster, name)
    drained_at = time.monotonic()
    assert httpx.post(cluster.replica_url(0) + f"/admin/v1/backends/{name}/drain", trust_env=False).json()[
        "draining"
    ]
    try:
        while not all(_draining(cluster, r, name) for r in (1, 2)):
            assert time.monotonic() - drained_at < 1.0, "the drain did not reach every replica within 1 s"
            time.sleep(0.01)
        before = _served(url)
        with httpx.Client(base_url=cluster.url, trust_env=False, timeout=10) as client:
            statuses = [client.post("/v1/chat/completions", json=BODY).status_code for _ in range(30)]
        assert statuses == [200] * 30
        assert _served(url) == before, "a replica still sent traffic to the drained backend"
    finally:
        httpx.post(cluster.replica_url(2) + f"/admin/v1/backends/{name}/undrain", trust_env=False)
    deadline = time.monotonic() + 1.0
    while any(_draining(cluster, r, name) for r in (0, 1, 2)):
        assert time.monotonic() < deadline, "the undrain did not reach every replica within 1 s"
        time.sleep(0.01)


def test_killing_a_replica_under_load_fails_only_what_it_was_serving(cluster: Cluster) -> None:
    log_offset = _balancer_log_size(cluster)
    with Load(cluster.url) as load:
        time.sleep(1.5)
        killed_at = time.monotonic()
        cluster.stop_replica(1, signal.SIGKILL)
        time.sleep(2.5)
    try:
        assert len(load.succeeded) > 50
        # The client does not retry. A request that failed must have been in flight when the replica died,
        # one per client thread at most; HAProxy retries the rest on another replica (refused connections,
        # and requests sent to the dying replica that got no answer: `option http-buffer-request` keeps
        # them retryable), so in practice none fails.
        assert all(o.started <= killed_at for o in load.failed), load.failed
        assert len(load.failed) <= load.threads, load.failed
        assert _balancer_retries(cluster, log_offset) > 0, "the kill did not exercise the balancer's retries"
        # What a replica answered is in Redis, except what a SIGKILLed one still held in its write-behind
        # buffer (flush_interval 0.05 s): requests answered in the last half second before the kill.
        time.sleep(0.5)
        checked = [o.request_id for o in load.succeeded if o.ended < killed_at - 0.5 or o.started > killed_at]
        assert _unrecorded(cluster, checked) == []
    finally:
        cluster.start_replica(1)


def test_a_rolling_restart_under_steady_load_fails_no_request(cluster: Cluster) -> None:
    log_offset = _balancer_log_size(cluster)
    with Load(cluster.url) as load:
        time.sleep(1.0)
        for index in range(3):
            # uvicorn re-raises the SIGTERM it handled once it has drained, hence -15.
            code = cluster.stop_replica(index, signal.SIGTERM)
            # one stuck in its shutdown writes every stack to its log (gateway/serve/watched.py)
            log = cluster.log(f"replica-{index}").read_text(errors="replace")
            assert code in (0, -signal.SIGTERM), f"replica-{index} ended {code}; log:\n{log[-6000:]}"
            cluster.start_replica(index)
            time.sleep(1.0)  # HAProxy: two passing checks 200 ms apart put it back
        time.sleep(1.0)
    # The client does not retry: every request, including those HAProxy had sent to a replica that then
    # closed its listener, is answered 200.
    assert load.failed == []
    assert _balancer_retries(cluster, log_offset) > 0, "the restarts did not exercise the balancer's retries"
    assert len(load.succeeded) > 50
    time.sleep(0.5)
    assert _unrecorded(cluster, [o.request_id for o in load.succeeded]) == []
