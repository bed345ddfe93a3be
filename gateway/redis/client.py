"""The one place that turns a Redis URL from the config into a client (ledger, keys, batches, fleet view).

    redis://[user:password@]host:port/db      one Redis (a primary: managed, Sentinel's address, local)
    rediss://...                              the same over TLS
    unix:///path/to/redis.sock?db=0           one Redis on a Unix socket
    redis+cluster://[user:password@]host:port[,host:port...]    a Redis Cluster (rediss+cluster: TLS)

For a cluster the listed nodes are only where discovery starts (one is enough, more survive one being
down); the client learns the slot map and follows MOVED/ASK. Every key of a deployment carries one hash
tag per component (`{sy:P}`, `{syt:P}`, `{syb:P}`), so each component's multi-key commands, transactions
and Lua scripts stay in one slot. A cluster has only database 0, and no Unix sockets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisClusterException, RedisError

CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
URL_PATTERN = r"^(rediss?(\+cluster)?|unix)://"
"""What the settings accept (the schema's check); `parse_redis_url` says what is wrong with the rest."""

AnyRedis = aioredis.Redis | RedisCluster
REDIS_ERRORS: tuple[type[RedisError], type[RedisClusterException], type[OSError]] = (
    RedisError,
    RedisClusterException,
    OSError,
)
"""What a failed call raises, on either client (a cluster's "no node serves this slot" is not a
RedisError)."""


@dataclass(frozen=True, slots=True)
class ClusterTarget:
    """A `redis+cluster://` URL, parsed."""

    nodes: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    ssl: bool


def parse_redis_url(url: str) -> ClusterTarget | None:
    """The cluster a `redis+cluster://` URL names, None for a single-Redis URL; ValueError if malformed."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in CLUSTER_SCHEMES:
        return None
    where = f"Redis Cluster URL {_redacted(url)!r}"
    if "?" in rest or "#" in rest:
        raise ValueError(f"{where}: takes no query options (a cluster has one database and no socket path)")
    credentials, at, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if path not in ("", "0"):
        raise ValueError(f"{where}: a Redis Cluster has only database 0, not /{path}")
    nodes: list[tuple[str, int]] = []
    for node in hosts.split(","):
        host, colon, port = node.strip().rpartition(":")
        if not colon:
            host, port = node.strip(), "6379"
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{where}: {node!r} is not host:port (list startup nodes as host:port,host:port)"
            )
        nodes.append((host, int(port)))
    username = password = None
    if at:
        user, colon, secret = credentials.partition(":")
        username, password = (unquote(user) or None), (unquote(secret) if colon else None)
        if not colon:  # redis://secret@host means a password, as redis-py reads it
            username, password = None, unquote(user)
    return ClusterTarget(tuple(nodes), username, password, scheme == "rediss+cluster")


def redis_client(url: str, **options: Any) -> AnyRedis:
    """redis-py's asyncio client for `url`: `RedisCluster` for `redis+cluster://`, else `Redis`.

    `options` are redis-py's (timeouts, retry, decode_responses) and mean the same for both."""
    target = parse_redis_url(url)
    if target is None:
        return aioredis.Redis.from_url(url, **options)
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in target.nodes],
        username=target.username,
        password=target.password,
        ssl=target.ssl,
        **options,
    )


def as_text(reply: bytes | str) -> str:
    """A Redis string reply as text. redis-py types every reply as `bytes | str` whatever the client's
    `decode_responses`, so a reply is read the same way from either kind of client."""
    return reply.decode() if isinstance(reply, bytes) else reply


async def subscriber(client: AnyRedis) -> Any:
    """A pub/sub object of `client`. On a cluster the client first learns the slot map: redis-py then
    subscribes on the node serving the channel's slot (a PUBLISH reaches every node of a cluster)."""
    if isinstance(client, RedisCluster):
        await client.initialize()
    return client.pubsub(ignore_subscribe_messages=True)


def _redacted(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    _, at, hosts = rest.rpartition("@")
    return f"{scheme}{sep}***@{hosts}" if at else url
