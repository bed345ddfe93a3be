"""The in-memory key store, the per-replica counters (the memory store's whole truth, and each replica's
share while Redis is away), and the reconcile with the shared counters when Redis returns."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest
import redis
import redis.asyncio as aioredis

from backends.models import Backend, Pool
from gateway.config.settings import AuthOptions, LedgerOptions
from gateway.ledger.factory import build_ledger
from gateway.tenants.admission import Tenant, Tenants
from gateway.tenants.answers import HeaderPlan, decoded, pairs, rate_headers
from gateway.tenants.keys import KeyRecord, Limits, TeamRecord, hash_key
from gateway.tenants.limits import NANO, LocalCounters, ScopeCounters, Verdict
from gateway.tenants.store_memory import MemoryTenantStore
from policies.profile import RequestProfile
from tests.integration.tcp_proxy import CuttableProxy


def _key(key_id: str, created: float, **limits: object) -> KeyRecord:
    return KeyRecord(id=key_id, created_at=created, hash=hash_key("sy-" + key_id), **limits)  # type: ignore[arg-type]


def test_memory_store_keys_rotation_teams_and_version() -> None:
    async def run() -> None:
        store = MemoryTenantStore()
        assert await store.version() == 0 and await store.key_by_hash("nope") is None
        first, second = _key("k1", 2.0, rpm=5), _key("k2", 1.0)
        await store.put_key(first)
        await store.put_key(second)
        assert await store.key_by_hash(first.hash) == first
        assert [k.id for k in await store.list_keys()] == ["k2", "k1"]  # by creation
        rotated = KeyRecord(id="k1", created_at=2.0, hash=hash_key("sy-new"), rpm=5)
        await store.put_key(rotated, old_hash=first.hash)
        assert await store.key_by_hash(first.hash) is None  # the old material stops at once
        assert await store.key_by_hash(rotated.hash) == rotated == await store.get_key("k1")
        await store.put_team(TeamRecord(name="b", rpm=1))
        await store.put_team(TeamRecord(name="a"))
        assert [t.name for t in await store.list_teams()] == ["a", "b"]
        assert await store.delete_team("b") == (True, 6)
        assert await store.delete_team("b") == (False, 7)
        assert await store.get_team("b") is None
        assert await store.version() == 7  # every change moved it, so replicas drop cached lookups

    asyncio.run(run())


def _scope(name: str = "k:a", **limits: object) -> ScopeCounters:
    return ScopeCounters(name, Limits(**limits), "total", 0)  # type: ignore[arg-type]


def test_local_counters_enforce_each_limit_and_settle() -> None:
    counters = LocalCounters(window_s=3600)
    rpm = [_scope("k:r", rpm=3)]
    assert [counters.admit(rpm, 1, 0).admitted for _ in range(4)] == [True, True, True, False]
    assert counters.admit(rpm, 1, 0).refused_by == "requests"

    tpm = [_scope("k:t", tpm=100)]
    first = counters.admit(tpm, 60, 0)
    assert first.admitted and counters.admit(tpm, 60, 0).refused_by == "tokens"
    counters.settle(tpm, first.window, -50, 0)  # it used 10 of the 60 reserved
    assert counters.admit(tpm, 60, 0).admitted

    parallel = [_scope("k:p", max_parallel=1)]
    held = counters.admit(parallel, 1, 0)
    assert held.admitted and counters.admit(parallel, 1, 0).refused_by == "parallel"
    counters.settle(parallel, held.window, 0, 0)
    assert counters.admit(parallel, 1, 0).admitted

    budget = [_scope("k:b", budget_usd=1.0)]
    reserved = counters.admit(budget, 1, NANO // 2)
    assert counters.admit(budget, 1, NANO // 2).admitted
    assert counters.admit(budget, 1, 1).refused_by == "budget"
    counters.settle(budget, reserved.window, 0, -NANO // 4)  # settled below its reservation
    assert counters.admit(budget, 1, NANO // 4).admitted


def test_local_counters_key_and_team_both_must_fit_and_nothing_is_taken_on_refusal() -> None:
    counters = LocalCounters(window_s=3600)
    scopes = [_scope("k:a", rpm=10), _scope("t:x", rpm=2)]
    assert counters.admit(scopes, 1, 0).admitted and counters.admit(scopes, 1, 0).admitted
    refused = counters.admit(scopes, 1, 0)
    assert not refused.admitted and refused.refused_scope == 1
    # The key's own counter was not charged by the refused request.
    assert counters.admit([_scope("k:a", rpm=3)], 1, 0).admitted
    assert not counters.admit([_scope("k:a", rpm=3)], 1, 0).admitted


def test_local_counters_roll_windows_but_keep_spend() -> None:
    counters = LocalCounters(window_s=1)
    scopes = [_scope("k:w", rpm=1, budget_usd=1.0)]
    assert counters.admit(scopes, 1, NANO // 2).admitted
    assert counters.admit(scopes, 1, 0).refused_by == "requests"
    time.sleep(1.05 - time.time() % 1)
    assert counters.admit(scopes, 1, NANO // 2).admitted  # a new window, the same budget period
    time.sleep(1.05 - time.time() % 1)
    assert counters.admit(scopes, 1, NANO // 2).refused_by == "budget"


def test_a_replicas_share_while_redis_is_away() -> None:
    share = LocalCounters(window_s=3600, share=1 / 3)
    scopes = [_scope("k:s", rpm=30, max_parallel=2)]
    assert sum(share.admit(scopes, 1, 0).admitted for _ in range(20)) == 1  # parallel: max(1, 2 // 3)
    share = LocalCounters(window_s=3600, share=1 / 3)
    scopes = [_scope("k:s", rpm=30)]
    assert sum(share.admit(scopes, 1, 0).admitted for _ in range(20)) == 10


def _profile() -> RequestProfile:
    return RequestProfile(model="m", prompt_tokens_estimate=10, context_needed=20, max_tokens=10)


@pytest.fixture()
def prefix() -> str:
    name = "utest-keys-" + uuid.uuid4().hex[:8]
    yield name
    client = redis.Redis()
    names = list(client.scan_iter(match=f"*{name}*", count=1000))
    if names:
        client.delete(*names)
    client.close()


def test_fail_open_admits_from_the_share_and_reconciles_when_redis_returns(prefix: str) -> None:
    proxy = CuttableProxy(6379)
    shared = redis.Redis()

    async def run() -> None:
        client = aioredis.Redis(port=proxy.port, socket_timeout=0.3, socket_connect_timeout=0.3)
        options = AuthOptions(mode="keys", window_s=3600, replicas=3, redis_timeout=0.3)
        ledger = build_ledger(LedgerOptions(store="memory"), [])
        tenants = Tenants(options, MemoryTenantStore(), ledger, prefix, client=client)
        await tenants.start()
        try:
            tenant = Tenant(_key("a", 1.0, rpm=30, max_parallel=10), None, False)
            ns = "{syt:" + prefix + "}"
            shared_admission = await tenants.admit(tenant, _profile(), [], [])
            window = shared_admission.window
            assert not shared_admission.local
            assert shared.hvals(f"{ns}:pa:k:a") == [b"1"]

            proxy.set_cut(True)
            tenants.settle(shared_admission, 10, 5, 0.0)  # its slot and tokens wait in the settler
            away = [await tenants.admit(tenant, _profile(), [], []) for _ in range(3)]
            assert all(a.local for a in away)
            for admission in away:
                tenants.settle(admission, 10, 2, 0.0)
            assert int(shared.get(f"{ns}:rq:k:a:{window}")) == 1  # Redis has not heard yet

            proxy.set_cut(False)
            deadline = time.monotonic() + 10
            while shared.hvals(f"{ns}:pa:k:a") and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            await asyncio.sleep(max(0.0, tenants._redis_down_until - time.monotonic()))
            back = await tenants.admit(tenant, _profile(), [], [])  # through Redis again
            assert not back.local
            tenants.settle(back, 10, 10, 0.0)
            await tenants.settler.flush()  # type: ignore[union-attr]
            # Nothing lost: the shared slot is freed, and the requests and tokens admitted from the
            # share while Redis was away are counted in the shared window for every replica.
            assert shared.hvals(f"{ns}:pa:k:a") == []
            assert int(shared.get(f"{ns}:rq:k:a:{window}")) == 5
            assert int(shared.get(f"{ns}:tk:k:a:{window}")) == 15 + 3 * 12 + 20
            assert tenants.settler.pending() == 0  # type: ignore[union-attr]
        finally:
            await tenants.close()
            await client.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()
        shared.close()


def test_close_returns_when_the_redis_client_swallows_the_cancellation(prefix: str) -> None:
    """redis-py can swallow a cancellation that lands while it reconnects (seen after a cut, under CPU
    load): the call returns normally and the task is never cancelled. `close` must not wait for a
    cancellation that never comes (it hung the test above, once in ten runs on two busy cores)."""

    async def run() -> None:
        client = aioredis.Redis(socket_timeout=0.3, socket_connect_timeout=0.3)
        options = AuthOptions(mode="keys", window_s=3600, replicas=3, redis_timeout=0.3)
        ledger = build_ledger(LedgerOptions(store="memory"), [])
        tenants = Tenants(options, MemoryTenantStore(), ledger, prefix, client=client)
        renewing = asyncio.Event()

        async def swallowing_set(*args: object, **kwargs: object) -> bool:
            renewing.set()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(0.5)
            return True

        await tenants.start()
        client.set = swallowing_set  # type: ignore[method-assign]
        try:
            await asyncio.wait_for(renewing.wait(), 5)  # the lease task is inside the Redis call
        finally:
            async with asyncio.timeout(5):
                await tenants.close()
            await client.aclose()

    asyncio.run(run())


def test_settlements_ride_with_the_next_admission_and_wait_again_if_it_fails(prefix: str) -> None:
    """A request's end leaves its settlement pending; the next admission's call carries it (applied
    before admitting, so a key at its parallel limit gets its slot back in that very call). A call that
    fails leaves it pending again."""
    proxy = CuttableProxy(6379)
    shared = redis.Redis()

    async def run() -> None:
        client = aioredis.Redis(port=proxy.port, socket_timeout=0.3, socket_connect_timeout=0.3)
        options = AuthOptions(mode="keys", window_s=3600, replicas=3, redis_timeout=0.3)
        ledger = build_ledger(LedgerOptions(store="memory"), [])
        # Not started: the settler's own timed flush never runs, so only admissions can carry settlements.
        tenants = Tenants(options, MemoryTenantStore(), ledger, prefix, client=client)
        settler = tenants.settler
        assert settler is not None
        ns = "{syt:" + prefix + "}"
        tenant = Tenant(_key("a", 1.0, rpm=100, max_parallel=1), None, False)
        first = await tenants.admit(tenant, _profile(), [], [])
        tk = f"{ns}:tk:k:a:{first.window}"
        assert shared.hvals(f"{ns}:pa:k:a") == [b"1"] and int(shared.get(tk)) == 20
        tenants.settle(first, 10, 5, 0.0)  # used 15 of the 20 tokens reserved; the slot is free
        assert settler.pending() == 2
        second = await tenants.admit(tenant, _profile(), [], [])  # max_parallel 1: needs the slot back
        assert not second.local and settler.pending() == 0
        assert shared.hvals(f"{ns}:pa:k:a") == [b"1"] and int(shared.get(tk)) == 15 + 20

        tenants.settle(second, 10, 10, 0.0)
        proxy.set_cut(True)
        third = await tenants.admit(tenant, _profile(), [], [])  # Redis away: from the local share
        assert third.local
        # The slot's return waits again (the second used what it reserved: no tokens' delta), beside
        # the third's request and tokens, counted in the shared window once Redis is back.
        assert settler.pending() == 3
        proxy.set_cut(False)
        assert await settler.flush()
        assert shared.hvals(f"{ns}:pa:k:a") == []
        assert int(shared.get(f"{ns}:rq:k:a:{first.window}")) == 3 and int(shared.get(tk)) == 15 + 20 + 20
        await client.aclose()

    try:
        asyncio.run(run())
    finally:
        proxy.close()
        shared.close()


def test_an_admitted_answers_headers_are_the_tightest_limits_as_bytes() -> None:
    """The fast header plan gives what `rate_headers` gives: per kind, the scope with least left."""
    key = _scope("k:a", rpm=100, tpm=1000)
    team = _scope("t:x", rpm=50, tpm=5000)
    loose = _scope("k:b")
    cases = [
        ([key, team], [10, 900, 0, 45, 900, 0]),  # requests: the team's (5 left); tokens: the key's (100)
        ([key, team], [99, 10, 0, 1, 4990, 0]),  # requests: the key's; tokens: the team's
        ([key, team], [120, 2000, 0, 60, 9000, 0]),  # over: never below zero
        ([loose, key], [5, 5, 0, 7, 70, 0]),  # a scope without limits shows nothing
        ([loose], [1, 1, 0]),
    ]
    for scopes, counts in cases:
        verdict = Verdict(True, -1, "", 1.5, 7, counts)
        assert decoded(pairs(HeaderPlan.of(scopes).lines(verdict))) == rate_headers(scopes, verdict), counts


@pytest.mark.parametrize("shared", [True, False], ids=["redis", "memory"])
def test_usage_keeps_spend_of_every_key_apart_from_what_is_held_and_when_last_used(
    prefix: str, shared: bool
) -> None:
    """A budgeted key's spend counts its requests in flight at their reservation: `held_usd` says how
    much, so a console can show settled spend steadily; a key without a budget has its spend kept too."""
    pool = Pool(name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=8, price_per_gpu_hour=2.0,
                labels={})  # fmt: skip
    backend = Backend(
        name="b", url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=4096, pool=pool
    )

    async def run() -> None:
        client = aioredis.Redis() if shared else None
        options = AuthOptions(mode="keys", window_s=3600, replicas=1)
        ledger = build_ledger(LedgerOptions(store="memory"), [])
        tenants = Tenants(options, MemoryTenantStore(), ledger, prefix, client=client)
        await tenants.start()
        try:
            budgeted = Tenant(_key("bud", 1.0, budget_usd=10.0, budget_period="total"), None, False)
            free = Tenant(_key("free", 1.0, budget_period="total"), None, False)
            assert await tenants.usage("k:bud", "total") == {"spent_usd": 0.0, "held_usd": 0.0,
                                                             "last_used_at": None}  # fmt: skip
            before = int(time.time())
            admission = await tenants.admit(budgeted, _profile(), [backend], [])
            reserved = admission.cost_nano / NANO
            assert reserved > 0
            usage = await tenants.usage("k:bud", "total")
            assert usage["spent_usd"] == pytest.approx(reserved) and usage["held_usd"] == pytest.approx(
                reserved
            )
            assert before <= usage["last_used_at"] <= time.time()
            tenants.settle(admission, 10, 5, 0.001)
            other = await tenants.admit(free, _profile(), [backend], [])
            assert other.cost_nano == 0, "a key without a budget reserves nothing"
            tenants.settle(other, 10, 5, 0.002)
            if tenants.settler is not None:
                assert await tenants.settler.flush()
            usage = await tenants.usage("k:bud", "total")
            assert usage["spent_usd"] == pytest.approx(0.001) and usage["held_usd"] == 0.0
            usage = await tenants.usage("k:free", "total")
            assert usage["spent_usd"] == pytest.approx(0.002) and usage["held_usd"] == 0.0
            assert usage["last_used_at"] is not None
        finally:
            await tenants.close()
            if client is not None:
                await client.aclose()

    asyncio.run(run())
