"""The contract every ledger store keeps, run on the in-memory store, on the real Redis at 6379 and on a
real three-node Redis Cluster (`redis+cluster://`, tests/redis_cluster.py).

Each Redis test uses a private key prefix, deleted afterwards. "Replicas" are separate ledger objects
sharing one store (for the in-memory store: the same object, since it cannot be shared).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import msgspec
import pytest
import redis.asyncio as aioredis

from backends.models import Backend, Pool
from gateway.config.settings import LedgerOptions
from gateway.ledger.base import LedgerBase
from gateway.ledger.keys import Keys
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import DIMENSIONS, UsageRecord
from gateway.ledger.redis_store import RedisLedger
from gateway.ledger.spill import LedgerSpill
from tests.redis_cluster import RedisCluster

REDIS_URL = "redis://127.0.0.1:6379/0"
T0 = 1_800_000_000.0  # a bucket boundary for 60 s buckets
NOW = T0 + 90

H100 = Pool(
    name="h100", vendor="nvidia", accelerator="h100", gpus_per_backend=1, price_per_gpu_hour=3.6, labels={}
)
MI300X = Pool(
    name="mi300x", vendor="amd", accelerator="mi300x", gpus_per_backend=2, price_per_gpu_hour=1.8, labels={}
)


def _backends() -> list[Backend]:
    def make(name: str, pool: Pool) -> Backend:
        return Backend(
            name=name, url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=10, pool=pool
        )

    return [make("nv-0", H100), make("nv-1", H100), make("amd-0", MI300X)]


def rec(request_id: str, **fields: object) -> UsageRecord:
    values: dict[str, object] = {
        "request_id": request_id,
        "endpoint": "chat",
        "model": "llama",
        "backend": "nv-0",
        "pool": "h100",
        "vendor": "nvidia",
        "accelerator": "h100",
        "key": "key-a",
        "request_class": "default",
        "route": "r",
        "stream": False,
        "status": 200,
        "prompt_tokens": 1000,
        "completion_tokens": 500,
        "usage_source": "backend",
        "ttft_s": 0.1,
        "duration_s": 9.0,
        "cost_usd": 0.001,
        "finished_at": T0 + 10,
        "busy_s": 9.0,
        "bound_nusd": 9_000_000,  # 9 s at $3.60/GPU-h x 1 GPU
    }
    values.update(fields)
    return UsageRecord(**values)  # type: ignore[arg-type]


Make = Callable[..., Awaitable[list[LedgerBase]]]


@pytest.fixture(params=["memory", "redis", "cluster"])
async def replicas(request: pytest.FixtureRequest) -> AsyncIterator[Make]:
    """`await replicas(n)`: n ledgers sharing one store, all on the same backends and a fixed clock."""
    prefix = f"test-{uuid.uuid4().hex[:12]}"
    made: list[LedgerBase] = []
    backends = _backends()
    url = request.getfixturevalue("cluster_redis").url if request.param == "cluster" else REDIS_URL

    async def make(n: int = 1, **overrides: object) -> list[LedgerBase]:
        options = LedgerOptions(key_prefix=prefix, redis_url=url, **overrides)  # type: ignore[arg-type]
        if request.param == "memory":
            ledgers: list[LedgerBase] = [
                InMemoryLedger(options=options, backends=backends, clock=lambda: NOW)
            ] * n
        else:
            ledgers = [RedisLedger(options, backends, clock=lambda: NOW) for _ in range(n)]
        made.extend(ledgers)
        return ledgers

    yield make
    for ledger in made:
        if isinstance(ledger, RedisLedger):
            await ledger.client.aclose()
    if request.param == "redis":
        client = aioredis.Redis.from_url(REDIS_URL)
        keys = [k async for k in client.scan_iter(match=Keys(prefix).pattern, count=1000)]
        if keys:
            await client.delete(*keys)
        await client.aclose()


RECORDS = [
    rec("r1"),
    rec("r2", backend="nv-1", prompt_tokens=20, completion_tokens=7, cost_usd=0.002, key="key-b"),
    rec(
        "r3",
        backend="amd-0",
        pool="mi300x",
        vendor="amd",
        accelerator="mi300x",
        prompt_tokens=30,
        completion_tokens=0,
        status=504,
        usage_source="estimated",
    ),
    rec("r4", model="qwen", completion_tokens=3),
]


async def _record_all(ledger: LedgerBase, records: list[UsageRecord]) -> None:
    for r in records:
        ledger.record(r)
    assert await ledger.flush()


@pytest.mark.parametrize("dim", DIMENSIONS)
async def test_totals_add_up_per_dimension(replicas: Make, dim: str) -> None:
    (ledger,) = await replicas()
    await _record_all(ledger, RECORDS)
    totals = await ledger.read_totals(dim)  # type: ignore[arg-type]
    assert sum(t.requests for t in totals.values()) == 4
    assert sum(t.prompt_tokens for t in totals.values()) == 2050
    assert sum(t.completion_tokens for t in totals.values()) == 510
    assert sum(t.cost_usd for t in totals.values()) == pytest.approx(0.005)
    assert sum(t.errors for t in totals.values()) == 1
    assert sum(t.estimated for t in totals.values()) == 1


async def test_totals_by_name(replicas: Make) -> None:
    (ledger,) = await replicas()
    await _record_all(ledger, RECORDS)
    vendors = await ledger.read_totals("vendor")
    assert set(vendors) == {"nvidia", "amd"}
    assert (vendors["nvidia"].requests, vendors["nvidia"].total_tokens) == (3, 2530)
    assert (await ledger.read_totals("model"))["qwen"].completion_tokens == 3
    assert (await ledger.read_totals("key"))["key-b"].prompt_tokens == 20


async def test_a_request_id_counts_once_across_retries_and_replicas(replicas: Make) -> None:
    first, second = await replicas(2)
    await _record_all(first, RECORDS)
    await _record_all(second, [rec("r1", prompt_tokens=99_999), *RECORDS])
    await _record_all(first, RECORDS[:2])
    for ledger in (first, second):
        total = (await ledger.read_totals("model"))["llama"]
        assert (total.requests, total.prompt_tokens) == (3, 1050)
        rows = {r.name: r for r in await ledger.costs("model", "1h")}
        assert rows["llama"].requests == 3


async def test_paid_time_is_not_doubled_by_replicas(replicas: Make) -> None:
    first, second = await replicas(2)
    for ledger in (first, second):
        await ledger.tick(now=T0)
    await first.tick(now=T0 + 90)
    await second.tick(now=T0 + 60.5)
    await second.tick(now=T0 + 90)
    rows = {r.name: r for r in await first.costs("backend", "15m")}
    # 90 s at $3.60/GPU-h x 1 GPU; the MI300X backend has 2 GPUs at $1.80.
    assert rows["nv-0"].paid_usd == pytest.approx(0.09)
    assert rows["amd-0"].paid_usd == pytest.approx(0.09)
    assert rows["amd-0"].gpu_hours == pytest.approx(2 * 90 / 3600)
    pools = {r.name: r for r in await second.costs("pool", "15m")}
    assert pools["h100"].paid_usd == pytest.approx(0.18)
    vendors = {r.name: r for r in await second.costs("vendor", "1h")}
    assert vendors["amd"].price_per_gpu_hour == pytest.approx(1.8)


async def test_effective_cost_split_and_utilisation(replicas: Make) -> None:
    (ledger,) = await replicas()
    await ledger.tick(now=T0)
    await ledger.tick(now=NOW)
    await _record_all(ledger, [rec("a")])
    row = {r.name: r for r in await ledger.costs("backend", "15m")}["nv-0"]
    # paid $0.09; weighted tokens 1000 + 4 x 500 = 3000 -> $30/M in, $120/M out; blended 0.09 / 1500
    assert row.spend_usd == pytest.approx(0.09)
    assert row.input_usd_per_mtok == pytest.approx(30.0)
    assert row.output_usd_per_mtok == pytest.approx(120.0)
    assert row.blended_usd_per_mtok == pytest.approx(60.0)
    assert row.utilisation == pytest.approx(9 / 90)
    assert row.price_per_gpu_hour == pytest.approx(3.6)
    idle = {r.name: r for r in await ledger.costs("backend", "15m")}["nv-1"]
    assert (idle.requests, idle.blended_usd_per_mtok, idle.utilisation) == (0, None, 0.0)
    models = {r.name: r for r in await ledger.costs("model", "15m")}
    # the only request in its bucket ($0.06 paid) is allocated its bound, 9 s of GPU time; the rest is idle
    assert models["llama"].paid_usd is None and models["llama"].allocated_nusd == 9_000_000
    assert row.allocated_nusd == 9_000_000 and row.idle_nusd == row.paid_nusd - 9_000_000
    paid = sum(r.paid_nusd or 0 for r in await ledger.costs("backend", "15m"))
    assert models["(idle)"].idle_nusd == paid - 9_000_000


async def test_refresh_feeds_routing_and_attribution(replicas: Make) -> None:
    (ledger,) = await replicas()
    await ledger.tick(now=T0)
    await ledger.tick(now=NOW)
    assert ledger.measured_cost("nv-0", 1, 1) is None
    await _record_all(ledger, [rec("a")])
    await ledger.refresh()
    nv0 = next(b for b in ledger.backends if b.name == "nv-0")
    nv1 = next(b for b in ledger.backends if b.name == "nv-1")
    assert nv0.measured_cost_per_mtok == pytest.approx(60.0)
    assert nv1.measured_cost_per_mtok is None
    assert ledger.measured_cost("nv-0", 1000, 500) == pytest.approx(0.09)
    assert ledger.measured_cost("nv-0", 0, 1) == pytest.approx(120e-6)
    assert ledger.measured_cost("nv-1", 1000, 500) is None


async def test_windows_select_buckets(replicas: Make) -> None:
    (ledger,) = await replicas()
    old = rec("old", finished_at=NOW - 2 * 3600)
    await _record_all(ledger, [rec("new"), old, rec("older", finished_at=NOW - 3 * 86400)])
    counts = {
        w: sum(r.requests for r in await ledger.costs("backend", w)) for w in ("1m", "15m", "1h", "24h")
    }
    assert counts == {"1m": 1, "15m": 1, "1h": 1, "24h": 2}


async def test_recent_and_stats(replicas: Make) -> None:
    (ledger,) = await replicas()
    await _record_all(ledger, RECORDS)
    assert [r.request_id for r in ledger.recent(2)] == ["r3", "r4"]
    stats = ledger.stats()
    assert (stats["buffered"], stats["dropped"]) == (0, 0)


async def test_close_flushes(replicas: Make) -> None:
    writer, reader = await replicas(2)
    await writer.start()
    for r in RECORDS:
        writer.record(r)
    await writer.close()
    assert (await reader.read_totals("pool"))["h100"].requests == 3
    assert dataclasses.asdict((await reader.read_totals("vendor"))["amd"])["errors"] == 1


async def test_spilled_records_are_replayed_into_a_cluster(
    cluster_redis: RedisCluster, tmp_path: Path
) -> None:
    """What a replica spilled while its Redis was away is written at its next start, on a cluster too."""
    path = tmp_path / "ledger.spill"
    earlier = LedgerSpill(path)
    assert earlier.claim()
    await earlier.append_new(deque(RECORDS))
    earlier.release()
    options = LedgerOptions(key_prefix=f"test-{uuid.uuid4().hex[:12]}", redis_url=cluster_redis.url)
    options = msgspec.structs.replace(options, spill_path=str(path))
    ledger = RedisLedger(options, _backends(), clock=lambda: NOW)
    await ledger.start()
    try:
        assert await ledger.flush()
        assert (await ledger.read_totals("pool"))["h100"].requests == 3
        assert ledger.stats()["replayed"] == len(RECORDS)
    finally:
        await ledger.close()
    assert not path.exists() or path.stat().st_size == 0  # acknowledged: nothing left to replay
