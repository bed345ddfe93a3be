"""`/v1/files` list and delete, and each key's quota on files and open batches, through the official openai
SDK against a gateway in keys mode, with its batch state in memory and in the real Redis (a private prefix).

The pool's only backend never answers (a closed port), so a batch stays open until it is cancelled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import redis

from tests.support import ROOT, clean_redis, free_port, running_gateway, running_replicas

MODEL = "llama-3.1-8b"
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex
MAX_FILE_BYTES = 4096
LINE = json.dumps(
    {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    }
)


@dataclass
class Gateway:
    url: str
    directory: Path
    """Where the gateway writes file bodies (`batches.directory`)."""

    def bodies(self) -> set[str]:
        return {p.name for p in (self.directory / "files").glob("*")}

    def admin(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=10)

    def key(self, **fields: Any) -> openai.OpenAI:
        with self.admin() as admin:
            made = admin.post("/admin/v1/keys", json={"name": "files", **fields})
        assert made.status_code == 201, made.text
        return self.sdk(made.json()["key"])

    def sdk(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=30)


@pytest.fixture(scope="module", params=["memory", "redis"])
def gateway(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    store = request.param
    directory = tmp_path_factory.mktemp("files")
    prefix = f"itest-files-{uuid.uuid4().hex[:10]}"
    config: dict[str, Any] = {
        "auth": {"mode": "keys", "store": store},
        "batches": {
            "store": store,
            "directory": str(directory),
            "max_file_bytes": MAX_FILE_BYTES,
            "max_stored_files": 4,
            "max_stored_bytes": 10 * MAX_FILE_BYTES,
            "max_open_batches": 2,
            "retry_backoff_s": 60,
        },
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"url": f"http://127.0.0.1:{free_port()}", "models": [MODEL], "max_model_len": 4096}
                ],
            }
        ],
    }
    if store == "redis":
        config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
    try:
        workdir = tmp_path_factory.mktemp(f"gw-files-{store}")
        with running_gateway(config, workdir, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as url:
            yield Gateway(url, directory)
    finally:
        if store == "redis":
            _clean(prefix)


def _clean(prefix: str) -> None:
    """The keys gateways wrote under ledger prefix `prefix`: ledger and tenants, and batch state (`syb:`)."""
    clean_redis(prefix)
    client = redis.Redis()
    keys = list(client.scan_iter(match=f"*syb:{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _upload(client: openai.OpenAI, size: int = 0) -> str:
    text = LINE + "\n" + " " * max(0, size - len(LINE) - 1)
    return client.files.create(file=("input.jsonl", text.encode()), purpose="batch").id


def _ids(client: openai.OpenAI, **options: Any) -> list[str]:
    return [f.id for f in client.files.list(**options)]


def test_files_list_pages_and_delete_frees_the_quota(gateway: Gateway) -> None:
    client = gateway.key()
    made = [_upload(client) for _ in range(4)]
    page = client.files.list()
    assert [f.id for f in page.data] == made[::-1] and not page.has_more
    assert _ids(client, limit=1) == made[::-1]  # the SDK pages on with `after`
    assert _ids(client, limit=3, order="asc") == made
    first = client.files.list(limit=2)
    assert first.has_more and first.data[-1].id == made[2]
    with pytest.raises(openai.RateLimitError) as over:
        _upload(client)
    assert over.value.code == "files_quota_exceeded"
    deleted = client.files.delete(made[0])
    assert (deleted.id, deleted.deleted, deleted.object) == (made[0], True, "file")
    assert made[0] not in gateway.bodies() and made[1] in gateway.bodies()
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made[0])
    with pytest.raises(openai.NotFoundError):
        client.files.delete(made[0])
    again = _upload(client)  # deleting made room
    assert _ids(client) == [again, *made[:0:-1]]
    for file_id in _ids(client, limit=1):  # a cleanup job: page and delete as it goes
        client.files.delete(file_id)
    assert _ids(client) == []


def test_uploads_over_the_size_or_the_bytes_are_refused_and_leave_nothing(gateway: Gateway) -> None:
    client = gateway.key(max_stored_bytes=3000)
    before = gateway.bodies()
    with pytest.raises(openai.APIStatusError) as big:
        _upload(client, MAX_FILE_BYTES + 1)
    assert (big.value.status_code, big.value.code) == (413, "file_too_large")
    with pytest.raises(openai.APIStatusError) as far:  # refused by its Content-Length, before it is read
        _upload(client, MAX_FILE_BYTES + 200_000)
    assert (far.value.status_code, far.value.code) == (413, "file_too_large")
    small = gateway.key(max_file_bytes=1024)
    for size in (2000, 100_000):
        with pytest.raises(openai.APIStatusError) as own:
            _upload(small, size)
        assert (own.value.status_code, own.value.code) == (413, "file_too_large")
    kept = _upload(client, 2000)
    with pytest.raises(openai.RateLimitError) as over:
        _upload(client, 1001)
    assert over.value.code == "files_quota_exceeded" and "max_stored_bytes" in over.value.message
    assert _ids(client) == [kept] and _ids(small) == []
    assert gateway.bodies() - before == {kept}  # the refused uploads left no body behind
    _upload(client, 1000)


def test_an_upload_the_store_cannot_write_is_forgotten_and_frees_its_quota(gateway: Gateway) -> None:
    client = gateway.key(max_stored_files=1)
    bodies = gateway.directory / "files"
    aside = gateway.directory / "files.aside"
    bodies.mkdir(exist_ok=True)
    bodies.rename(aside)
    bodies.write_bytes(b"")  # a file where the store's folder should be: every write fails
    try:
        with pytest.raises(openai.InternalServerError) as failed:
            _upload(client)
        assert (failed.value.status_code, failed.value.code) == (503, "file_store_unavailable")
        assert _ids(client) == []
    finally:
        bodies.unlink()
        aside.rename(bodies)
    kept = _upload(client)  # the failed upload holds no share of the quota
    assert _ids(client) == [kept]


def test_concurrent_uploads_cannot_go_over_the_quota(gateway: Gateway) -> None:
    client = gateway.key(max_stored_files=3)

    def upload(_: int) -> int:
        try:
            _upload(client)
        except openai.RateLimitError as exc:
            assert exc.code == "files_quota_exceeded"
            return 429
        return 200

    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(upload, range(24)))
    assert answers.count(200) == 3 and answers.count(429) == 21
    assert len(_ids(client)) == 3


def test_open_batches_over_the_quota_and_a_file_in_use_are_refused(gateway: Gateway) -> None:
    client = gateway.key(max_open_batches=1)
    file_id = _upload(client)
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with pytest.raises(openai.RateLimitError) as over:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert over.value.code == "batch_quota_exceeded"
    with pytest.raises(openai.ConflictError) as in_use:
        client.files.delete(file_id)
    assert in_use.value.code == "file_in_use"
    assert client.files.retrieve(file_id).id == file_id
    client.batches.cancel(batch.id)
    deadline = time.monotonic() + 30
    while client.batches.retrieve(batch.id).status != "cancelled":
        assert time.monotonic() < deadline, client.batches.retrieve(batch.id)
        time.sleep(0.1)
    assert client.files.delete(file_id).deleted
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    second = client.batches.create(
        input_file_id=_upload(client), endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert second.status == "validating"  # the cancelled batch no longer counts
    client.batches.cancel(second.id)


def test_another_key_neither_lists_nor_deletes_a_keys_files_and_the_admin_lists_all(gateway: Gateway) -> None:
    owner, other = gateway.key(), gateway.key()
    file_id = _upload(owner)
    assert file_id not in _ids(other)
    with pytest.raises(openai.NotFoundError):
        other.files.delete(file_id)
    with pytest.raises(openai.BadRequestError) as cursor:
        other.files.list(after=file_id)
    assert cursor.value.code == "invalid_value"
    assert file_id in _ids(gateway.sdk(ADMIN_KEY))
    anonymous = httpx.Client(base_url=gateway.url, timeout=10)
    for method, path in (("GET", "/v1/files"), ("DELETE", f"/v1/files/{file_id}")):
        answer = anonymous.request(method, path)
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
    upload = anonymous.post(
        "/v1/files", data={"purpose": "batch"}, files={"file": ("x.jsonl", LINE.encode())}
    )
    assert upload.status_code == 401 and upload.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        gateway.sdk("sy-wrong").files.list()
    assert owner.files.retrieve(file_id).id == file_id


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=10001", "limit"),
        ("limit=abc", "limit"),
        ("limit=-1", "limit"),
        ("limit=" + "9" * 5000, "limit"),
        ("limit=%EF%BC%91", "limit"),  # a full-width digit
        ("order=up", "order"),
        ("after=../../etc", "after"),
        ("after=file-never-made", "after"),
        ("purpose=B%00", "purpose"),
        ("limit=1&limit=2", "limit"),
        ("order=asc&order=desc", "order"),
        ("after=" + "file-" + "a" * 200, "after"),
    ],
)
def test_bad_list_parameters_are_invalid_values(gateway: Gateway, query: str, param: str) -> None:
    client = gateway.key()
    file_id = _upload(client)
    with httpx.Client(base_url=gateway.url, headers={"authorization": f"Bearer {client.api_key}"}) as raw:
        answer = raw.get(f"/v1/files?{query}")
    error = answer.json()["error"]
    assert answer.status_code == 400 and (error["code"], error["param"]) == ("invalid_value", param), error
    assert _ids(client) == [file_id]


def test_bad_batch_and_file_parameters_have_string_codes(gateway: Gateway) -> None:
    client = gateway.key()
    file_id = _upload(client)
    for fields, param in (
        ({"endpoint": "/v1/nope", "completion_window": "24h"}, "endpoint"),
        ({"endpoint": "/v1/chat/completions", "completion_window": "1h"}, "completion_window"),
    ):
        with pytest.raises(openai.BadRequestError) as bad:
            client.batches.create(input_file_id=file_id, **fields)  # type: ignore[arg-type]
        assert (bad.value.code, bad.value.param) == ("invalid_value", param)
    with pytest.raises(openai.BadRequestError) as purpose:
        client.files.create(file=("x.jsonl", LINE.encode()), purpose="assistants")
    assert (purpose.value.code, purpose.value.param) == ("invalid_value", "purpose")
    assert _ids(client) == [file_id] and client.batches.list().data == []


def test_the_cli_and_the_admin_api_set_and_clear_a_keys_quotas(gateway: Gateway) -> None:
    env = {**os.environ, "SWITCHYARD_ADMIN_KEY": ADMIN_KEY}
    switchyard = [sys.executable, "-m", "gateway.cli", "keys"]
    created = subprocess.run(
        [
            *switchyard,
            *("create", "--url", gateway.url, "--max-stored-files", "1", "--max-open-batches", "0"),
            *("--max-stored-bytes", "5000", "--max-file-bytes", "2048", "--json"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    made = json.loads(created.stdout)
    assert (made["max_stored_files"], made["max_open_batches"]) == (1, 0)
    assert (made["max_stored_bytes"], made["max_file_bytes"]) == (5000, 2048)
    client = gateway.sdk(made["key"])
    file_id = _upload(client)
    with pytest.raises(openai.RateLimitError):
        _upload(client)
    with pytest.raises(openai.RateLimitError) as no_batches:
        client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h")
    assert no_batches.value.code == "batch_quota_exceeded"
    updated = subprocess.run(
        [*switchyard, "update", made["id"], "--url", gateway.url, "--clear", "max_stored_files", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "max_stored_files" not in json.loads(updated.stdout)  # back to the config's 4
    _upload(client)
    with gateway.admin() as admin:
        refused = admin.patch(f"/admin/v1/keys/{made['id']}", json={"max_open_batches": -1})
        assert refused.status_code == 400
        assert admin.patch(f"/admin/v1/keys/{made['id']}", json={"max_open_batches": 1}).status_code == 200
    deadline = time.monotonic() + 5  # every replica drops its cached key within auth.refresh_interval
    while True:
        try:
            client.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_two_replicas_on_one_redis_hold_the_quotas_together(tmp_path: Path) -> None:
    prefix = f"itest-files2-{uuid.uuid4().hex[:10]}"
    config: dict[str, Any] = {
        "auth": {"mode": "keys"},
        "ledger": {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix},
        "batches": {"directory": str(tmp_path / "files"), "max_stored_files": 3, "max_open_batches": 2},
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"url": f"http://127.0.0.1:{free_port()}", "models": [MODEL], "max_model_len": 4096}
                ],
            }
        ],
    }
    try:
        workdirs = [tmp_path / "a", tmp_path / "b"]
        with running_replicas([config, config], workdirs, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as urls:
            made = Gateway(urls[0], tmp_path / "files").key()
            clients = [Gateway(url, tmp_path / "files").sdk(made.api_key) for url in urls]

            def upload(i: int) -> str | None:
                try:
                    return _upload(clients[i % 2])
                except openai.RateLimitError:
                    return None

            with ThreadPoolExecutor(12) as pool:
                uploaded = [f for f in pool.map(upload, range(24)) if f is not None]
            assert len(uploaded) == 3 and sorted(_ids(clients[1])) == sorted(uploaded)

            def create(i: int) -> str | None:
                try:
                    return (
                        clients[i % 2]
                        .batches.create(
                            input_file_id=uploaded[i % 3],
                            endpoint="/v1/chat/completions",
                            completion_window="24h",
                        )
                        .id
                    )
                except openai.RateLimitError as exc:
                    assert exc.code == "batch_quota_exceeded"
                    return None

            with ThreadPoolExecutor(12) as pool:
                created = [b for b in pool.map(create, range(24)) if b is not None]
            assert len(created) == 2
            for batch_id in created:
                clients[0].batches.cancel(batch_id)
    finally:
        _clean(prefix)
