"""A batch through the official openai SDK with the gateway's files in an S3-compatible bucket (moto's
server on loopback, checking signatures): two replicas share the bucket and the Redis state, and nothing
goes to `batches.directory`. Upload on one, create, wait, download from the other; the objects are in the
bucket, read back with boto3.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import redis

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.integration.test_batches import FLEET, _jsonl, _line, _upload, _wait
from tests.s3_server import REGION, S3Server, s3_server
from tests.support import clean_redis, free_port, running_gateway, running_replicas


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    with s3_server(tmp_path_factory.mktemp("moto")) as server:
        yield server


def test_a_batch_with_its_files_in_the_bucket(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> None:
    bucket = f"switchyard-{uuid.uuid4().hex[:8]}"
    s3.client().create_bucket(Bucket=bucket)
    unused: Path = tmp_path_factory.mktemp("never-written")
    prefix = f"itest-batch-s3-{uuid.uuid4().hex[:10]}"
    spec = parse_fleet_spec(FLEET, "<batch fleet>")
    try:
        with Fleet(spec, log_dir=tmp_path_factory.mktemp("s3-fleet")) as fleet:
            config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
            config["gateway"] = {**config.get("gateway", {}), "shutdown_grace": 1.0}
            config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
            config["batches"] = {
                "directory": str(unused),
                "s3": {"endpoint": s3.endpoint, "bucket": bucket, "region": REGION, "prefix": "switchyard/"},
            }
            workdirs = [tmp_path_factory.mktemp(f"s3-gw-{name}") for name in "ab"]
            with running_replicas([config, config], workdirs, env=s3.env) as urls:
                one, other = (
                    openai.OpenAI(base_url=url + "/v1", api_key="sk-open", max_retries=0) for url in urls
                )
                file_id = _upload(one, [_line(f"req-{i}") for i in range(6)])
                batch = one.batches.create(
                    input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
                )
                done = _wait(one, batch.id, {"completed", "failed", "expired"}, timeout=30)
                assert done.status == "completed", done
                output = _jsonl(other, done.output_file_id)
                assert sorted(o["custom_id"] for o in output) == [f"req-{i}" for i in range(6)]
                assert all(o["response"]["status_code"] == 200 for o in output)
                downloaded = other.files.content(done.output_file_id).content
    finally:
        clean_redis(prefix)
        clean_redis_batches(prefix)
    client = s3.client()
    stored = client.get_object(Bucket=bucket, Key=f"switchyard/files/{done.output_file_id}")["Body"].read()
    assert stored == downloaded  # the bytes the SDK got are the bucket's
    keys = {o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"switchyard/files/{file_id}" in keys
    assert sum(key.startswith(f"switchyard/batches/{batch.id}/lines/") for key in keys) == 6
    assert not any(unused.iterdir())


def test_a_missing_bucket_is_a_503_and_a_log_line(
    s3: S3Server, tmp_path_factory: pytest.TempPathFactory
) -> None:
    workdir = tmp_path_factory.mktemp("s3-gw-missing")
    config: dict[str, Any] = {
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"url": f"http://127.0.0.1:{free_port()}", "models": ["m"], "max_model_len": 4096}
                ],
            }
        ],
        "batches": {"s3": {"endpoint": s3.endpoint, "bucket": "no-such-bucket", "region": REGION}},
    }
    with running_gateway(config, workdir, env=s3.env) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-open", max_retries=0)
        with pytest.raises(openai.APIStatusError) as refused:
            _upload(client, [_line("req-0")])
    assert refused.value.status_code == 503
    assert refused.value.body["code"] == "file_store_unavailable"  # type: ignore[index]
    log = (workdir / "gateway.log").read_text()
    assert "bucket `no-such-bucket`" in log and "does not exist" in log
    assert s3.secret_access_key not in log


def clean_redis_batches(prefix: str) -> None:
    """The batch state's keys (`syb:`), which tests.support.clean_redis leaves."""
    client = redis.Redis()
    keys = list(client.scan_iter(match=f"*syb:{prefix}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()
