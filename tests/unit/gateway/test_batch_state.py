"""Line claims of a batch, on the memory store and on the real Redis (a private prefix): none lost, none
counted twice."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from gateway.batch.memory_state import MemoryBatchState
from gateway.batch.objects import BatchObject, FileObject, StoredBatch, StoredFile
from gateway.batch.redis_state import RedisBatchState
from gateway.batch.state import BatchState
from gateway.batch.transitions import to_finalizing, to_in_progress


def _batch() -> StoredBatch:
    batch = BatchObject(
        id="batch_" + uuid.uuid4().hex,
        endpoint="/v1/chat/completions",
        input_file_id="file-x",
        completion_window="24h",
        status="validating",
        created_at=1,
    )
    return StoredBatch(batch=batch, owner="key-a")


async def created(state: BatchState, stored: StoredBatch) -> StoredBatch:
    """`stored` recorded, with the input file it names (a batch is recorded only while its input exists)."""
    file_id = stored.batch.input_file_id
    meta = FileObject(id=file_id, bytes=10, created_at=1, filename="in.jsonl", purpose="batch")
    if await state.get_file(file_id) is None:
        await state.put_file(StoredFile(file=meta, owner=stored.owner, path=f"files/{file_id}"))
    assert await state.create(stored) is None
    return stored


async def _states() -> AsyncIterator[BatchState]:
    yield MemoryBatchState()
    client = aioredis.Redis()
    prefix = f"utest-batch-{uuid.uuid4().hex[:8]}"
    state = RedisBatchState(client, prefix)
    try:
        yield state
    finally:
        keys = [k async for k in client.scan_iter(match=f"*syb:{prefix}*")]
        if keys:
            await client.delete(*keys)
        await state.close()


def _each_state(test):  # type: ignore[no-untyped-def]
    def run() -> None:
        async def all_states() -> None:
            async for state in _states():
                await test(state)

        asyncio.run(all_states())

    run.__name__ = test.__name__
    run.body = test  # type: ignore[attr-defined]  # tests/integration/test_redis_cluster_clients.py
    return run


@_each_state
async def test_a_lapsed_lease_is_claimed_again_and_a_result_counts_once(state: BatchState) -> None:
    stored = _batch()
    await created(state, stored)
    first = await state.claim(stored.batch.id, 2, "replica-a", 0.05)
    second = await state.claim(stored.batch.id, 2, "replica-a", 30)
    assert (first, second) == (0, 1)
    assert await state.claim(stored.batch.id, 2, "replica-b", 30) is None  # all leased, none lapsed
    await asyncio.sleep(0.1)
    assert await state.claim(stored.batch.id, 2, "replica-b", 30) == 0  # replica-a's lease lapsed
    await state.renew(stored.batch.id, [0], "replica-a", 0.01)  # not its lease any more: no effect
    await asyncio.sleep(0.05)
    assert await state.claim(stored.batch.id, 2, "replica-c", 30) is None
    assert await state.finish(stored.batch.id, 0, "o:b", failed=False)
    assert not await state.finish(stored.batch.id, 0, "o:a", failed=False)  # the slow replica's result
    assert await state.finish(stored.batch.id, 1, "e:c", failed=True)
    assert await state.progress(stored.batch.id) == (1, 1, 0)
    assert await state.results(stored.batch.id) == {0: "o:b", 1: "e:c"}


@_each_state
async def test_a_released_line_waits_its_backoff(state: BatchState) -> None:
    stored = _batch()
    await created(state, stored)
    line = await state.claim(stored.batch.id, 1, "a", 30)
    await state.release(stored.batch.id, line or 0, "a", 0.1)
    assert await state.claim(stored.batch.id, 1, "b", 30) is None
    await asyncio.sleep(0.15)
    assert await state.claim(stored.batch.id, 1, "b", 30) == 0
    assert await state.attempt(stored.batch.id, 0) == 1 and await state.attempt(stored.batch.id, 0) == 2


@_each_state
async def test_status_changes_happen_once_and_listing_pages(state: BatchState) -> None:
    made = [_batch() for _ in range(3)]
    for stored in made:
        await created(state, stored)
        await asyncio.sleep(0.002)
    target = made[0].batch.id
    assert (await state.update(target, to_in_progress(5, "m"))) is not None
    assert await state.update(target, to_in_progress(5, "m")) is None  # already in progress
    assert (await state.update(target, to_finalizing("expired"))).ending == "expired"  # type: ignore[union-attr]
    page, more = await state.page("key-a", None, 2)
    assert [b.batch.id for b in page] == [made[2].batch.id, made[1].batch.id] and more
    rest, more = await state.page("key-a", page[-1].batch.id, 2)
    assert [b.batch.id for b in rest] == [target] and not more
    assert await state.page("key-b", None, 2) == ([], False)
    assert await state.get("batch_missing") is None


@_each_state
async def test_every_owners_batches_list_together_for_an_admin(state: BatchState) -> None:
    made = [_batch() for _ in range(3)]
    made[1].owner = "key-b"
    for stored in made:
        await created(state, stored)
        await asyncio.sleep(0.002)
    page, more = await state.page(None, None, 2)
    assert [b.batch.id for b in page] == [made[2].batch.id, made[1].batch.id] and more
    rest, more = await state.page(None, page[-1].batch.id, 2)
    assert [b.batch.id for b in rest] == [made[0].batch.id] and not more
    mine, _ = await state.page("key-b", None, 10)
    assert [b.batch.id for b in mine] == [made[1].batch.id]
