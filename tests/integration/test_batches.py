"""The Batch API through the official openai SDK: two gateway replicas on the shared Redis (a private
prefix), a simulated fleet, API keys. Upload, create, poll, download; a malformed line; cancel; expiry;
and a batch finished by the other replica after the one running it is killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis
import yaml

from backends.lifetime import die_with_parent
from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import ROOT, free_port, two_pool_fleet

MODEL = "llama-3.1-8b"
FLEET = two_pool_fleet(MODEL)
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
LEASE_S = 1.5


@dataclass
class Cluster:
    urls: list[str]
    processes: list[subprocess.Popen[bytes]]
    key: str
    key_id: str

    def sdk(self, i: int = 0) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.urls[i] + "/v1", api_key=self.key, max_retries=0, timeout=30)


def _start(config: dict[str, Any], workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    config = {**config, "gateway": {**config.get("gateway", {}), "port": port}}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        cwd=ROOT,
        stdout=(workdir / "gateway.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
        env={**os.environ, "SWITCHYARD_ADMIN_KEY": ADMIN_KEY},
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError((workdir / "gateway.log").read_text())
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/health", timeout=1).status_code == 200:
                return process, base
        if time.monotonic() > deadline:
            raise RuntimeError("gateway did not start")
        time.sleep(0.05)


def _stop(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    spec = parse_fleet_spec(FLEET, "<batch fleet>")
    prefix = f"itest-batch-{uuid.uuid4().hex[:10]}"
    files = tmp_path_factory.mktemp("batch-files")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        with Fleet(spec, log_dir=tmp_path_factory.mktemp("batch-fleet")) as fleet:
            config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
            config["gateway"] = {**config.get("gateway", {}), "shutdown_grace": 1.0}
            config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
            config["auth"] = {"mode": "keys"}
            config["batches"] = {"directory": str(files), "lease_s": LEASE_S, "per_backend": 3}
            urls = []
            for name in "ab":
                process, url = _start(config, tmp_path_factory.mktemp(f"batch-gw-{name}"))
                processes.append(process)
                urls.append(url)
            with httpx.Client(base_url=urls[0], headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
                made = admin.post("/admin/v1/keys", json={"name": "batcher", "budget_usd": 100.0})
            assert made.status_code == 201, made.text
            yield Cluster(urls, processes, made.json()["key"], made.json()["id"])
    finally:
        for process in processes:
            _stop(process)
        client = redis.Redis()
        for pattern in (f"*syb:{prefix}*", f"*syt:{prefix}*", f"*sy:{prefix}*"):
            keys = list(client.scan_iter(match=pattern, count=1000))
            if keys:
                client.delete(*keys)
        client.close()


def _line(custom_id: str, max_tokens: int = 8, **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"hi {custom_id}"}],
            "max_tokens": max_tokens,
            **body,
        },
    }


def _upload(client: openai.OpenAI, lines: list[Any]) -> str:
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n"
    created = client.files.create(file=("input.jsonl", text.encode()), purpose="batch")
    assert created.purpose == "batch" and created.bytes == len(text.encode())
    return created.id


def _wait(client: openai.OpenAI, batch_id: str, statuses: set[str], timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(0.2)


def _jsonl(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines() if line]


def test_upload_create_poll_download_with_a_malformed_line(cluster: Cluster) -> None:
    client = cluster.sdk()
    lines: list[Any] = [_line(f"req-{i}") for i in range(12)]
    lines.insert(5, "{this is not json")
    lines.insert(7, {"custom_id": "bad-url", "method": "POST", "url": "/v1/nope", "body": {}})
    file_id = _upload(client, lines)
    assert client.files.retrieve(file_id).id == file_id
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"job": "test"},
    )
    assert batch.status == "validating" and batch.completion_window == "24h"
    done = _wait(client, batch.id, {"completed", "failed", "expired"})
    assert done.status == "completed", done
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed, done.request_counts.failed) == (
        14,
        12,
        2,
    )
    assert done.metadata == {"job": "test"} and done.completed_at is not None
    output = _jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(12))
    for o in output:
        assert o["error"] is None and o["response"]["status_code"] == 200
        assert o["response"]["body"]["choices"][0]["message"]["content"]
        assert o["response"]["body"]["usage"]["completion_tokens"] > 0
    errors = _jsonl(client, done.error_file_id)
    assert {e["custom_id"] for e in errors} == {None, "bad-url"}
    assert all(e["error"]["code"] == "invalid_request" for e in errors)
    # The other replica serves the same batch and files (shared Redis and directory).
    other = cluster.sdk(1)
    assert other.batches.retrieve(batch.id).status == "completed"
    assert len(_jsonl(other, done.output_file_id)) == 12
    listed = client.batches.list(limit=100)
    assert batch.id in [b.id for b in listed.data]
    # The lines ran as class `batch`, charged to the key that created the batch. Either replica may have
    # run some; the other's records reach the fleet's list at its next sync (gateway/fleet_sync.py).
    with httpx.Client(base_url=cluster.urls[0], headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        deadline = time.monotonic() + 15
        while True:
            recent = admin.get("/admin/v1/requests", params={"limit": 1000}).json()["data"]
            mine = [r for r in recent if r["request_id"].startswith(batch.id)]
            if len(mine) >= 12 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(mine) == 12 and {r["request_class"] for r in mine} == {"batch"}
        key = admin.get(f"/admin/v1/keys/{cluster.key_id}").json()
    assert key["spent_usd"] > 0


def test_a_responses_batch_answers_each_line_unstored(cluster: Cluster) -> None:
    client = cluster.sdk()
    lines: list[Any] = [
        {
            "custom_id": f"r-{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": MODEL, "input": f"hello {i}", "max_output_tokens": 4},
        }
        for i in range(3)
    ]
    lines.append(
        {
            "custom_id": "chained",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": MODEL, "input": "x", "previous_response_id": "resp_1"},
        }
    )
    batch = client.batches.create(
        input_file_id=_upload(client, lines), endpoint="/v1/responses", completion_window="24h"
    )
    done = _wait(client, batch.id, {"completed", "failed", "expired"})
    assert done.status == "completed", done
    output = _jsonl(client, done.output_file_id)
    assert sorted(o["custom_id"] for o in output) == ["r-0", "r-1", "r-2"]
    for o in output:
        body = o["response"]["body"]
        assert o["response"]["status_code"] == 200 and body["object"] == "response"
        assert body["usage"]["input_tokens"] > 0 and body["usage"]["output_tokens"] > 0
        with pytest.raises(openai.NotFoundError):  # batch lines are not stored
            client.responses.retrieve(body["id"])
    errors = _jsonl(client, done.error_file_id)
    assert [e["custom_id"] for e in errors] == ["chained"]
    assert "previous_response_id" in errors[0]["error"]["message"]


def test_bad_requests_change_nothing(cluster: Cluster) -> None:
    client = cluster.sdk()
    file_id = _upload(client, [_line("x")])
    with pytest.raises(openai.BadRequestError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="1h")  # type: ignore[arg-type]
    with pytest.raises(openai.NotFoundError):
        client.batches.create(
            input_file_id="file-nope", endpoint="/v1/chat/completions", completion_window="24h"
        )
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.BadRequestError):
        client.files.create(file=("x.jsonl", b"{}\n"), purpose="assistants")
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=cluster.urls[0] + "/v1", api_key="sy-wrong", max_retries=0).batches.list()


def test_another_key_sees_none_of_a_keys_files_and_batches(cluster: Cluster) -> None:
    client = cluster.sdk()
    file_id = _upload(client, [_line("mine")])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with httpx.Client(base_url=cluster.urls[0], headers={"authorization": f"Bearer {ADMIN_KEY}"}) as admin:
        other_key = admin.post("/admin/v1/keys", json={"name": "other", "budget_usd": 1.0}).json()["key"]
    other = openai.OpenAI(base_url=cluster.urls[1] + "/v1", api_key=other_key, max_retries=0, timeout=30)
    with pytest.raises(openai.NotFoundError):
        other.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.batches.cancel(batch.id)
    with pytest.raises(openai.NotFoundError):
        other.files.retrieve(file_id)
    with pytest.raises(openai.NotFoundError):
        other.files.content(file_id)
    assert batch.id not in [b.id for b in other.batches.list()]
    with pytest.raises(openai.NotFoundError):  # nor may it run a batch from another key's file
        other.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert client.batches.retrieve(batch.id).status != "cancelling"


def test_cancel_keeps_what_finished(cluster: Cluster) -> None:
    client = cluster.sdk()
    file_id = _upload(client, [_line(f"c-{i}", max_tokens=200) for i in range(60)])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _wait(client, batch.id, {"in_progress"})
    time.sleep(1.0)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling"
    done = _wait(client, batch.id, {"cancelled"})
    assert done.request_counts is not None and done.cancelled_at is not None
    assert 0 < done.request_counts.completed < 60
    assert len(_jsonl(client, done.output_file_id)) == done.request_counts.completed
    with pytest.raises(openai.ConflictError):
        client.batches.cancel(batch.id)


def test_a_batch_survives_its_replica_killed(cluster: Cluster) -> None:
    victim = cluster.processes[1]
    client = cluster.sdk(0)
    total = 60
    file_id = _upload(client, [_line(f"k-{i}", max_tokens=120) for i in range(total)])
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    _wait(client, batch.id, {"in_progress"})
    deadline = time.monotonic() + 30
    while client.batches.retrieve(batch.id).request_counts.completed < 10:  # type: ignore[union-attr]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    os.killpg(victim.pid, signal.SIGKILL)  # mid-batch, with lines of its own in flight
    victim.wait()
    done = _wait(client, batch.id, {"completed"}, timeout=90)
    output = _jsonl(client, done.output_file_id)
    ids = [o["custom_id"] for o in output]
    assert sorted(ids) == sorted(f"k-{i}" for i in range(total)), "every line exactly once"
    assert done.request_counts is not None and done.request_counts.completed == total


def test_expiry_keeps_finished_lines(tmp_path_factory: pytest.TempPathFactory) -> None:
    spec = parse_fleet_spec(FLEET, "<batch fleet>")
    with Fleet(spec, log_dir=tmp_path_factory.mktemp("expiry-fleet")) as fleet:
        config: dict[str, Any] = fleet.gateway_config()
        config["batches"] = {
            "directory": str(tmp_path_factory.mktemp("expiry-files")),
            "window_s": 2.0,
            "per_backend": 1,
        }
        process, url = _start(config, tmp_path_factory.mktemp("expiry-gw"))
        try:
            client = openai.OpenAI(base_url=url + "/v1", api_key="anything", max_retries=0)
            file_id = _upload(client, [_line(f"e-{i}", max_tokens=150) for i in range(40)])
            batch = client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            done = _wait(client, batch.id, {"expired", "completed"}, timeout=30)
        finally:
            _stop(process)
    assert done.status == "expired" and done.expired_at is not None
    counts = done.request_counts
    assert counts is not None and 0 < counts.completed < 40 and counts.completed + counts.failed == 40
