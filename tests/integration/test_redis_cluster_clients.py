"""The Redis clients of gateway/redis/client.py and the raw script client on a real Redis Cluster, alone:
the script client finds its hash tag's slot and follows it when the slot moves (a script that names its
keys is answered MOVED; one that names none, "non local key"); the fleet's pub/sub reaches a subscriber
whichever node it is published on; the batch state's claims, leases and watched updates (the tests of
tests/unit/gateway/test_batch_state.py, on the cluster)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from redis.crc import key_slot

from gateway.batch.redis_state import RedisBatchState
from gateway.redis.client import redis_client, subscriber
from gateway.redis.script_client import ScriptClient, bulk
from tests.redis_cluster import RedisCluster
from tests.unit.gateway import test_batch_file_quota, test_batch_state

COUNT = "return redis.call('INCR', ARGV[1] .. ':n')"
"""Names no key (as `limits.ADMIT`): Redis cannot redirect it, only refuse a key it does not serve."""
COUNT_KEY = "return redis.call('INCR', KEYS[1])"
"""Names its key (as `limits.SETTLE`): a node that does not serve it answers MOVED."""


async def _call(client: ScriptClient, *args: str, numkeys: int) -> object:
    answered: asyncio.Future[object] = asyncio.get_running_loop().create_future()
    client.call(len(args), b"".join(bulk(a) for a in args), answered.set_result, numkeys=numkeys)
    return await answered


def test_the_script_client_follows_its_slot_to_another_node(cluster_redis: RedisCluster) -> None:
    tag = "{syt:sc-" + uuid.uuid4().hex[:8] + "}"
    slot = key_slot(tag.encode())

    async def run() -> None:
        client = redis_client(cluster_redis.url)
        by_namespace = ScriptClient.like(client, COUNT, 2.0, tag)
        by_key = ScriptClient.like(client, COUNT_KEY, 2.0, tag)
        try:
            first = cluster_redis.owner(slot)
            calls = [_call(by_namespace, tag, numkeys=0) for _ in range(20)]
            calls += [_call(by_key, f"{tag}:k", numkeys=1) for _ in range(20)]
            assert sorted(await asyncio.gather(*calls)) == sorted([*range(1, 21), *range(1, 21)])
            assert by_namespace._address[1] == first and by_key._address[1] == first
            target = next(p for p in cluster_redis.ports if p != first)
            await asyncio.to_thread(cluster_redis.move_slot, slot, target)
            # Pipelined calls all refused by the old owner, then re-sent to the new one.
            calls = [_call(by_namespace, tag, numkeys=0) for _ in range(20)]
            calls += [_call(by_key, f"{tag}:k", numkeys=1) for _ in range(20)]
            assert sorted(await asyncio.gather(*calls)) == sorted([*range(21, 41), *range(21, 41)])
            assert by_namespace._address[1] == target and by_key._address[1] == target
            # The node closes the connection: redialled (to the slot's owner) and the call answered once.
            local = by_key._transport.get_extra_info("sockname")  # type: ignore[union-attr]
            node = cluster_redis.node(target)
            assert node.execute_command("CLIENT", "KILL", "ADDR", f"{local[0]}:{local[1]}") == 1
            assert await _call(by_key, f"{tag}:k", numkeys=1) == 41
        finally:
            await by_namespace.close()
            await by_key.close()
            await client.aclose()

    asyncio.run(run())


def test_fleet_pubsub_reaches_a_subscriber_from_every_node(cluster_redis: RedisCluster) -> None:
    channel = "{sy:ps-" + uuid.uuid4().hex[:8] + "}:fleet:events"

    async def run() -> None:
        publisher = redis_client(cluster_redis.url, decode_responses=True)
        listener = redis_client(cluster_redis.url, decode_responses=True)
        pubsub = await subscriber(listener)
        try:
            await pubsub.subscribe(channel)
            await publisher.publish(channel, json.dumps({"n": 0}))  # as the fleet view publishes
            for n, port in enumerate(cluster_redis.ports[1:], start=1):  # and from each other node
                cluster_redis.node(port).publish(channel, json.dumps({"n": n}))
            got = []
            async with asyncio.timeout(5):
                async for message in pubsub.listen():
                    got.append(json.loads(message["data"])["n"])
                    if len(got) == 3:
                        break
            assert sorted(got) == [0, 1, 2]  # from three nodes: no order between them
        finally:
            await pubsub.aclose()
            await publisher.aclose()
            await listener.aclose()

    asyncio.run(run())


@pytest.mark.parametrize(
    "test",
    [
        test_batch_state.test_a_lapsed_lease_is_claimed_again_and_a_result_counts_once,
        test_batch_state.test_a_released_line_waits_its_backoff,
        test_batch_state.test_status_changes_happen_once_and_listing_pages,
        test_batch_state.test_every_owners_batches_list_together_for_an_admin,
        test_batch_file_quota.test_concurrent_uploads_cannot_go_over_the_quota_together,
        test_batch_file_quota.test_open_batches_over_the_quota_are_refused_even_when_racing,
        test_batch_file_quota.test_a_file_read_by_a_batch_not_ended_cannot_be_deleted,
        test_batch_file_quota.test_listing_pages_in_either_order_by_purpose_and_past_a_deleted_cursor,
    ],
    ids=[
        "claims",
        "backoff",
        "status-and-pages",
        "admin-pages",
        "file-quota",
        "batch-quota",
        "file-in-use",
        "file-pages",
    ],
)
def test_batch_state_on_a_cluster(cluster_redis: RedisCluster, test: Any) -> None:
    async def run() -> None:
        state = RedisBatchState(redis_client(cluster_redis.url), f"utest-batch-{uuid.uuid4().hex[:8]}")
        try:
            await test.body(state)
        finally:
            await state.close()

    asyncio.run(run())
