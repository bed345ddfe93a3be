"""`batches.s3`: what an operator writes, and the errors that name the field to fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from backends.yamlfile import ConfigError
from gateway.config.settings import settings_from_text
from tests.support import ONE_POOL as POOLS


@pytest.fixture
def keys(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKID")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")


def test_a_bucket_instead_of_the_directory(keys: None) -> None:
    text = (
        POOLS
        + """
batches:
  s3:
    endpoint: http://minio:9000
    bucket: switchyard-batches
    region: eu-central-1
    prefix: prod/files/
"""
    )
    s3 = settings_from_text(text).batches.s3
    assert s3 is not None
    assert (s3.endpoint, s3.bucket, s3.region, s3.prefix) == (
        "http://minio:9000",
        "switchyard-batches",
        "eu-central-1",
        "prod/files/",
    )
    assert s3.addressing == "path" and s3.sign_payload and s3.max_attempts == 4
    assert settings_from_text(POOLS).batches.s3 is None


@pytest.mark.parametrize(
    ("s3", "field"),
    [
        ("{endpoint: 'minio:9000', bucket: bkt}", "endpoint"),
        ("{endpoint: 'http://minio:9000/path', bucket: bkt}", "endpoint"),
        ("{endpoint: 'http://minio:9000', bucket: 'b/k'}", "bucket"),
        ("{endpoint: 'http://minio:9000', bucket: bkt, prefix: '../up/'}", "prefix"),
        ("{endpoint: 'http://minio:9000', bucket: bkt, prefix: 'no-slash'}", "prefix"),
        ("{endpoint: 'http://minio:9000', bucket: bkt, addressing: dns}", "addressing"),
        ("{endpoint: 'http://minio:9000', bucket: bkt, secret: x}", "secret"),
        ("{bucket: bkt}", "endpoint"),
    ],
)
def test_bad_values_name_the_field(keys: None, s3: str, field: str) -> None:
    with pytest.raises(ConfigError) as error:
        settings_from_text(POOLS + f"\nbatches:\n  s3: {s3}\n", "gw.yaml")
    assert field in str(error.value) and "gw.yaml:10: " in str(error.value)


def test_missing_keys_name_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MY_S3_KEY", raising=False)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    text = (
        POOLS
        + """
batches:
  s3:
    endpoint: https://s3.eu-central-1.amazonaws.com
    bucket: switchyard-batches
    access_key_id_env: MY_S3_KEY
"""
    )
    expected = r"gw\.yaml:13: batches\.s3\.access_key_id_env: environment variable `MY_S3_KEY`"
    with pytest.raises(ConfigError, match=expected):
        settings_from_text(text, "gw.yaml")


def test_the_example_configs_commented_bucket_loads(keys: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/switchyard.example.yaml with its `batches.s3` lines uncommented is a valid config."""
    monkeypatch.setenv("H100_A_KEY", "sk-example")
    text = (Path(__file__).resolve().parents[3] / "deploy" / "switchyard.example.yaml").read_text()
    text = re.sub(r"(?m)^  # s3:", "  s3:", text)
    text = re.sub(r"(?m)^  #   ([a-z_]+:)", r"    \1", text)
    s3 = settings_from_text(text, "switchyard.example.yaml").batches.s3
    assert s3 is not None and s3.bucket == "switchyard-batches" and s3.prefix == "prod/"
