"""Property: for random traffic, prices, bucket edges and Redis outages, paid = allocated + idle.

Checked on the in-memory ledger and on the real Redis at 6379 (private key prefix per example), the Redis
ledger reaching it through a TCP relay the test cuts and restores (a real outage: connections drop, a
batch may be applied without its reply arriving and is then re-sent). A second Redis ledger re-sends
some records, as a replica re-sending a buffered batch would. Every bucket and backend must conserve to
the nano-dollar, so must the sums by every dimension, and no request may be allocated more than its
bound (price x GPUs x its time on the backend) while idle cost is kept apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.models import Backend, Pool
from gateway.config.settings import LedgerOptions
from gateway.ledger.allocation import allocate_bucket, request_allocation
from gateway.ledger.base import LedgerBase
from gateway.ledger.costs import IDLE_ROW, paid_nusd
from gateway.ledger.keys import Keys
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import DIMENSIONS, GPU_DIMENSIONS, UsageRecord
from gateway.ledger.redis_store import RedisLedger

REDIS_PORT = 6379
T0 = 1_800_000_000.0
KEYS = ("key-a", "key-b", "key-c")
MODELS = ("llama", "qwen")
CLASSES = ("default", "batch")


class Relay:
    """A TCP relay to the real Redis that can be cut (open connections dropped, new ones refused)."""

    def __init__(self) -> None:
        self.up = True
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.up:
            writer.close()
            return
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", REDIS_PORT)
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(Exception):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def cut(self) -> None:
        self.up = False
        for writer in list(self._writers):
            writer.close()

    def restore(self) -> None:
        self.up = True

    async def close(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()


@dataclass
class Fleet:
    backends: list[Backend]
    bucket_seconds: int


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    backends = []
    for i in range(draw(st.integers(1, 3))):
        pool = Pool(
            name=f"pool-{i % 2}",
            vendor=("nvidia", "amd")[i % 2],
            accelerator="h100",
            gpus_per_backend=draw(st.integers(1, 8)),
            price_per_gpu_hour=draw(st.floats(0.0, 12.0, allow_nan=False).map(lambda p: round(p, 4))),
            labels={},
        )
        backends.append(
            Backend(
                name=f"b{i}", url="http://127.0.0.1:1", models=frozenset(MODELS), max_model_len=8, pool=pool
            )
        )
    return Fleet(backends, draw(st.sampled_from([1, 7, 60])))


# events: ("rec", backend index, prompt, completion, duration, finish offset, key, model, class)
#         ("tick", offset) | ("flush",) | ("cut",) | ("restore",) | ("resend", record index)
EVENT = st.one_of(
    st.tuples(
        st.just("rec"),
        st.integers(0, 2),
        st.integers(0, 5000),
        st.integers(0, 2000),
        st.floats(0.0, 1.5, allow_nan=False),  # duration, in buckets
        st.floats(0.0, 1.0),
        st.sampled_from(KEYS),
        st.sampled_from(MODELS),
        st.sampled_from(CLASSES),
    ),
    st.tuples(st.just("tick"), st.floats(0.0, 1.0)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("cut")),
    st.tuples(st.just("restore")),
    st.tuples(st.just("resend"), st.integers(0, 1000)),
)


def _record(fleet: Fleet, n: int, event: tuple, start: float, span: float) -> UsageRecord:
    _, index, prompt, completion, duration, at, key, model, cls = event
    backend = fleet.backends[index % len(fleet.backends)]
    return UsageRecord(
        request_id=uuid.uuid4().hex,
        endpoint="chat",
        model=model,
        backend=backend.name,
        pool=backend.pool.name,
        vendor=backend.pool.vendor,
        accelerator="h100",
        key=key,
        request_class=cls,
        route="r",
        stream=False,
        status=200,
        prompt_tokens=prompt,
        completion_tokens=completion,
        usage_source="backend",
        ttft_s=None,
        duration_s=duration * fleet.bucket_seconds,
        cost_usd=0.0,
        finished_at=start + at * span,
        bound_nusd=int(backend.pool.backend_price_per_second * duration * fleet.bucket_seconds * 1e9),
    )


async def _play(
    ledger: LedgerBase, replica: LedgerBase, relay: Relay | None, fleet: Fleet, events: list, start: float
) -> list[UsageRecord]:
    span = 4.5 * fleet.bucket_seconds
    sent: list[UsageRecord] = []
    clock = [start]
    ledger._clock = replica._clock = lambda: clock[0]
    await ledger.tick(now=start)
    for n, event in enumerate(events):
        kind = event[0]
        if kind == "rec":
            record = _record(fleet, n, event, start, span)
            sent.append(record)
            ledger.record(record)
        elif kind == "tick":
            clock[0] = max(clock[0], start + event[1] * span)
            with contextlib.suppress(Exception):  # an outage: the next tick catches up
                await ledger.tick(now=clock[0])
        elif kind == "flush":
            await ledger.flush()
        elif kind == "cut" and relay is not None:
            relay.cut()
        elif kind == "restore" and relay is not None:
            relay.restore()
        elif kind == "resend" and sent:
            replica.record(sent[event[1] % len(sent)])
            assert await replica.flush()
    if relay is not None:
        relay.restore()
    clock[0] = start + span
    assert await ledger.flush()
    await ledger.tick(now=clock[0])
    return sent


async def _check(
    ledger: LedgerBase, fleet: Fleet, sent: list[UsageRecord], start: float, keep_idle: bool
) -> None:
    backends = {b.name: b for b in fleet.backends}
    weight = ledger.options.output_token_weight
    size = fleet.bucket_seconds
    total_paid = 0
    first, last = int(start // size) * size, int(ledger._clock() // size) * size
    buckets = list(range(first, last + size, size))
    for by in DIMENSIONS:
        for bucket, (_counters, paid_ms, shares) in zip(
            buckets, await ledger._window(by, buckets), strict=True
        ):
            paid = {name: paid_nusd(ms, backends[name]) for name, ms in paid_ms.items()}
            by_name, by_backend, idle = allocate_bucket(paid, shares, not keep_idle)
            for name, value in paid.items():  # every bucket, every backend
                assert by_backend.get(name, 0) + idle[name] == value and idle[name] >= 0
            assert sum(by_name.values()) == sum(by_backend.values())
            if not keep_idle or by != "key":
                continue
            here = [r for r in sent if int(r.finished_at // size) * size == bucket]
            total_w: dict[str, int] = {}
            for r in here:
                total_w[r.backend] = total_w.get(r.backend, 0) + round(
                    r.prompt_tokens + weight * r.completion_tokens
                )
            ideal: dict[str, float] = {}
            for r in here:
                w = round(r.prompt_tokens + weight * r.completion_tokens)
                share = request_allocation(paid.get(r.backend, 0), total_w[r.backend], w, r.bound_nusd)
                assert share <= r.bound_nusd  # never more than its time on the backend costs
                ideal[r.key] = ideal.get(r.key, 0.0) + share
            for key, value in by_name.items():  # the sums are the requests' allocations, rounded down
                assert ideal[key] - 2 * len(here) - 1 <= value <= ideal[key] + 1e-6 * ideal[key] + 1
        rows = await ledger.costs(by, "15m")
        if by in GPU_DIMENSIONS:
            for row in rows:
                assert row.paid_nusd == row.allocated_nusd + row.idle_nusd and row.idle_nusd >= 0
            paid_here = sum(row.paid_nusd or 0 for row in rows)
        else:
            assert all(row.idle_nusd is None for row in rows if row.name != IDLE_ROW)
            paid_here = sum(row.allocated_nusd + (row.idle_nusd or 0) for row in rows)
        if by == "backend":
            total_paid = paid_here
        assert paid_here == total_paid, by
        assert sum(row.requests for row in rows) == len(sent)


COMMON = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


@COMMON
@given(fleet=fleets(), events=st.lists(EVENT, max_size=60), offset=st.floats(0.0, 1.0), spread=st.booleans())
def test_conservation_on_the_memory_ledger(fleet: Fleet, events: list, offset: float, spread: bool) -> None:
    async def run() -> None:
        options = LedgerOptions(bucket_seconds=fleet.bucket_seconds, idle_cost="spread" if spread else "idle")
        ledger = InMemoryLedger(options=options, backends=fleet.backends)
        start = T0 + offset * fleet.bucket_seconds
        sent = await _play(ledger, ledger, None, fleet, events, start)
        await _check(ledger, fleet, sent, start, keep_idle=not spread)

    asyncio.run(run())


@COMMON
@given(fleet=fleets(), events=st.lists(EVENT, max_size=60), offset=st.floats(0.0, 1.0), spread=st.booleans())
def test_conservation_on_the_redis_ledger(fleet: Fleet, events: list, offset: float, spread: bool) -> None:
    async def run() -> None:
        relay = Relay()
        await relay.start()
        prefix = f"prop-{uuid.uuid4().hex[:12]}"
        options = LedgerOptions(
            bucket_seconds=fleet.bucket_seconds,
            idle_cost="spread" if spread else "idle",
            key_prefix=prefix,
            redis_url=f"redis://127.0.0.1:{relay.port}/0",
            redis_timeout=0.5,
        )
        direct = LedgerOptions(**{**_fields(options), "redis_url": f"redis://127.0.0.1:{REDIS_PORT}/0"})
        ledger, replica = RedisLedger(options, fleet.backends), RedisLedger(direct, fleet.backends)
        try:
            start = T0 + offset * fleet.bucket_seconds
            sent = await _play(ledger, replica, relay, fleet, events, start)
            await _check(ledger, fleet, sent, start, keep_idle=not spread)
        finally:
            await relay.close()
            for each in (ledger, replica):
                await each.client.aclose()
            client = aioredis.Redis(port=REDIS_PORT)
            keys = [k async for k in client.scan_iter(match=Keys(prefix).pattern, count=1000)]
            if keys:
                await client.delete(*keys)
            await client.aclose()

    asyncio.run(run())


def _fields(options: LedgerOptions) -> dict:
    return {name: getattr(options, name) for name in options.__struct_fields__}
