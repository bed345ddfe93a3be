"""gateway/redis/client.py: which URL makes which client, and the config errors an operator sees."""

from __future__ import annotations

import uuid

import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from backends.yamlfile import ConfigError
from gateway.config.settings import settings_from_text
from gateway.redis.client import ClusterTarget, as_text, parse_redis_url, redis_client
from tests.support import ONE_POOL as POOLS


def test_single_redis_urls_are_not_clusters() -> None:
    for url in ("redis://127.0.0.1:6379/0", "rediss://h:6380/2", "unix:///run/redis.sock?db=1"):
        assert parse_redis_url(url) is None
        assert isinstance(redis_client(url), aioredis.Redis)


def test_cluster_urls_list_startup_nodes_and_credentials() -> None:
    assert parse_redis_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7001,redis-2") == ClusterTarget(
        (("10.0.0.1", 7000), ("10.0.0.2", 7001), ("redis-2", 6379)), None, None, False
    )
    assert parse_redis_url("rediss+cluster://gw:s%40cret@node:7000/0") == ClusterTarget(
        (("node", 7000),), "gw", "s@cret", True
    )
    assert parse_redis_url("redis+cluster://secret@node:7000") == ClusterTarget(
        (("node", 7000),), None, "secret", False
    )
    client = redis_client("redis+cluster://127.0.0.1:7000,127.0.0.1:7001")
    assert isinstance(client, RedisCluster)
    assert sorted(client.nodes_manager.startup_nodes) == ["127.0.0.1:7000", "127.0.0.1:7001"]


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis+cluster://node:7000/1", "only database 0"),
        ("redis+cluster://node:7000?ssl_cert_reqs=none", "no query options"),
        ("redis+cluster://node:70000", "not host:port"),
        ("redis+cluster://a:7000,,b:7001", "not host:port"),
    ],
)
def test_a_bad_cluster_url_is_refused_at_load_with_the_reason(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_redis_url(url)
    with pytest.raises(ConfigError, match=f"ledger.redis_url: .*{says}"):
        settings_from_text(f"ledger: {{redis_url: '{url}'}}\n" + POOLS)


def test_the_password_is_not_repeated_in_the_error() -> None:
    with pytest.raises(ValueError) as error:
        parse_redis_url("redis+cluster://gw:hunter2@node:7000/3")
    assert "hunter2" not in str(error.value)


def test_settings_accept_a_cluster_url_for_the_ledger_and_for_keys() -> None:
    text = (
        "ledger: {redis_url: 'redis+cluster://a:7000,b:7000'}\nauth: {redis_url: 'rediss+cluster://c:7000'}\n"
    )
    settings = settings_from_text(text + POOLS)
    assert settings.ledger.redis_url == "redis+cluster://a:7000,b:7000"
    with pytest.raises(ConfigError, match="redis_url"):
        settings_from_text("ledger: {redis_url: 'cluster://a:7000'}\n" + POOLS)


async def test_as_text_reads_a_reply_alike_from_either_kind_of_client() -> None:
    key = f"test-as-text-{uuid.uuid4().hex}"
    raw = redis_client("redis://127.0.0.1:6379/0")
    decoding = redis_client("redis://127.0.0.1:6379/0", decode_responses=True)
    try:
        await raw.set(key, "drain \u2713")
        replies = [await raw.get(key), await decoding.get(key)]
        assert [type(reply) for reply in replies] == [bytes, str]
        assert [as_text(reply) for reply in replies] == ["drain \u2713", "drain \u2713"]
    finally:
        await raw.delete(key)
        await raw.aclose()
        await decoding.aclose()
