"""`limits.ADMIT` with many requests in one call (`AdmitBatcher`, one event-loop turn): each request is
judged as if alone, against the counters as the ones before it in the batch left them, on the real Redis."""

from __future__ import annotations

import asyncio
import time
import uuid

import redis

from gateway.redis.script_client import ScriptClient, bulk, bulk_int
from gateway.tenants.admit_batch import AdmitBatcher, encode_scopes, render
from gateway.tenants.answers import verdict_of
from gateway.tenants.limits import ADMIT
from tests.support import clean_redis


def _scope(name: str, rpm: int = 0, tpm: int = 0, par: int = 0, budget: int = -1) -> str:
    return f"{name}|total|{rpm}|{tpm}|{par}|{budget}|0|600"


def _batch(ns: str, requests: list[tuple[int, int, list[str]]]) -> list[str]:
    async def run() -> list[str]:
        client = ScriptClient(ADMIT, timeout_s=2.0)
        try:
            batcher = AdmitBatcher(client, 3_600_000, "replica-1", ns)
            futures = [batcher.admit(tokens, cost, encode_scopes(args)) for tokens, cost, args in requests]
            return [(await f).decode() for f in futures]
        finally:
            await client.close()

    return asyncio.run(run())


def test_one_batch_counts_each_request_against_those_before_it() -> None:
    prefix = "test-admit-" + uuid.uuid4().hex[:8]
    ns = "{syt:" + prefix + "}"
    shared = redis.Redis()
    try:
        key, team = _scope("k:a", rpm=3, budget=1000), _scope("t:x", tpm=100, par=4)
        answers = _batch(ns, [(10, 100, [key, team])] * 5 + [(95, 1, [_scope("k:b"), team])])
        verdicts = [verdict_of(a) for a in answers]
        assert [v.admitted for v in verdicts] == [True, True, True, False, False, False]
        assert [v.refused_by for v in verdicts[3:]] == ["requests", "requests", "tokens"]
        assert verdicts[2].counts == [3, 30, 300, 3, 30, 300]  # spend kept for every scope, budget or not
        assert verdicts[3].counts == [3, 30, 300]  # before: nothing of it was taken
        assert verdicts[5].refused_scope == 1  # the team's tokens: 30 + 95 > 100
        window = verdicts[0].window
        assert int(shared.get(f"{ns}:rq:k:a:{window}")) == 3
        assert int(shared.get(f"{ns}:tk:t:x:{window}")) == 30
        assert shared.hgetall(f"{ns}:pa:t:x") == {b"replica-1": b"3"}
        assert int(shared.get(f"{ns}:sp:k:a:total")) == 300
        assert shared.get(f"{ns}:rq:k:b:{window}") is None  # refused by its team: nothing taken

        # The next batch starts from what the first one wrote: the team's parallel slots (4) run out
        # after one, a budget after what is left of it.
        answers = _batch(ns, [(1, 700, [_scope("k:c", budget=1000), team]), (1, 1, [_scope("k:d"), team])])
        verdicts = [verdict_of(a) for a in answers]
        assert [v.admitted for v in verdicts] == [True, False]
        assert verdicts[1].refused_by == "parallel"
        answers = _batch(ns, [(1, 700, [key]), (1, 600, [key])])
        assert [verdict_of(a).refused_by for a in answers] == ["requests", "requests"]
        answers = _batch(
            ns, [(1, 600, [_scope("k:a2", budget=1000)]), (1, 500, [_scope("k:a2", budget=1000)])]
        )
        assert [verdict_of(a).refused_by for a in answers] == ["", "budget"]
    finally:
        clean_redis(prefix)
        shared.close()


def _settle_batch(
    ns: str, settlements: list[tuple[str, int]], requests: list[tuple[int, int, list[str]]]
) -> list[str]:
    """One `limits.ADMIT` call carrying `settlements` (counter, delta) before `requests`."""

    class _Pending:
        def take(self) -> dict[bytes, int]:
            return {bulk(counter): delta for counter, delta in settlements}

        def restore(self, pending: dict[bytes, int]) -> None:
            raise AssertionError(f"the call failed: {pending}")

    async def run() -> list[str]:
        client = ScriptClient(ADMIT, timeout_s=2.0)
        try:
            batcher = AdmitBatcher(client, 3_600_000, "replica-1", ns, _Pending())  # type: ignore[arg-type]
            futures = [batcher.admit(tokens, cost, encode_scopes(args)) for tokens, cost, args in requests]
            return [(await f).decode() for f in futures]
        finally:
            await client.close()

    return asyncio.run(run())


def test_settling_never_revives_an_ended_counter_and_never_goes_below_zero() -> None:
    """A settlement for a window or period that ended (its counter expired) is dropped, not written to a
    counter without a TTL; one for a counter that lives is applied, clamped at zero; a slot given back to
    a hash that is gone leaves nothing behind."""
    prefix = "test-settle-" + uuid.uuid4().hex[:8]
    ns = "{syt:" + prefix + "}"
    shared = redis.Redis()
    try:
        day = _scope("k:s", budget=10_000).replace("|total|", "|d2026-11-27|").replace("|0|600", "|90000|600")
        first = verdict_of(_batch(ns, [(50, 400, [day, _scope("t:s")])])[0])
        assert first.admitted
        tk = f"{ns}:tk:k:s:{first.window}"
        spend, held = f"{ns}:sp:k:s:d2026-11-27", f"{ns}:hd:k:s:d2026-11-27"
        for name in (f"{ns}:rq:k:s:{first.window}", tk, spend, held, f"{ns}:pa:k:s", f"{ns}:lu:k:s"):
            ttl = shared.pttl(name)
            assert ttl > 0 or name.endswith(":lu:k:s"), (name, ttl)  # every counter made expires
        last_used = shared.get(f"{ns}:lu:k:s")
        assert isinstance(last_used, bytes) and abs(int(last_used) - time.time()) < 5
        ended = [
            (f"{ns}:tk:k:s:{first.window - 1}", -7),  # the window before: expired
            (f"{ns}:sp:k:s:d2026-11-26", 300),  # yesterday's spend: expired
            (f"{ns}:sp:t:never:total", 5),  # a total that was never made
            (f"{ns}:pa:k:gone", -1),  # a slots' hash that is gone
        ]
        living = [(tk, -80), (spend, -100), (f"{ns}:pa:k:s", -1)]
        answers = _settle_batch(ns, ended + living, [(1, 0, [_scope("k:t")])])
        assert verdict_of(answers[0]).admitted
        for name, _ in ended:
            assert not shared.exists(name), name
        assert shared.get(tk) == b"0"  # 50 - 80: clamped at zero
        assert shared.get(spend) == b"300"  # 400 reserved, 100 back
        assert shared.hgetall(f"{ns}:pa:k:s") == {}
        assert shared.pttl(tk) > 0
    finally:
        clean_redis(prefix)
        shared.close()


def test_a_dead_replicas_slots_never_refuse_and_a_live_ones_do() -> None:
    """Leases are looked at only when the slots would refuse: the answer is the same as if each were."""
    prefix = "test-lease-" + uuid.uuid4().hex[:8]
    ns = "{syt:" + prefix + "}"
    shared = redis.Redis()
    try:
        shared.hset(f"{ns}:pa:k:p", mapping={"dead": 5, "alive": 1})
        shared.set(f"{ns}:lease:alive", 1, px=60_000)
        par = _scope("k:p", par=3)
        answers = _batch(ns, [(1, 0, [par])] * 3)
        assert [verdict_of(a).refused_by for a in answers] == ["", "", "parallel"]  # 1 alive + 2 here
        assert shared.hgetall(f"{ns}:pa:k:p") == {b"alive": b"1", b"replica-1": b"2"}  # the dead one is gone
        shared.delete(f"{ns}:lease:alive")
        answers = _batch(ns, [(1, 0, [par])] * 2)
        assert [verdict_of(a).refused_by for a in answers] == ["", "parallel"]
    finally:
        clean_redis(prefix)
        shared.close()


def test_a_dead_replicas_field_is_dropped_within_a_second_without_a_refusal() -> None:
    """Far from its limit a busy scope still forgets lapsed replicas (restarts do not pile up fields)."""
    prefix = "test-lapsed-" + uuid.uuid4().hex[:8]
    ns = "{syt:" + prefix + "}"
    shared = redis.Redis()
    try:
        shared.hset(f"{ns}:pa:k:q", mapping={"dead": 5})
        shared.set(f"{ns}:lu:k:q", 1)  # last used long ago: this second's first batch looks at leases
        assert verdict_of(_batch(ns, [(1, 0, [_scope("k:q", par=1000)])])[0]).admitted
        assert shared.hgetall(f"{ns}:pa:k:q") == {b"replica-1": b"1"}
    finally:
        clean_redis(prefix)
        shared.close()


def test_the_round_trips_are_counted_for_metrics() -> None:
    prefix = "test-admit-" + uuid.uuid4().hex[:8]
    ns = "{syt:" + prefix + "}"

    async def run() -> AdmitBatcher:
        client = ScriptClient(ADMIT, timeout_s=2.0)
        try:
            batcher = AdmitBatcher(client, 3_600_000, "replica-1", ns)
            first = [batcher.admit(1, 1, encode_scopes([_scope("k:m", rpm=2)])) for _ in range(3)]
            await asyncio.gather(*first)  # one turn of the loop, one call: two admitted, one refused
            await batcher.admit(1, 1, encode_scopes([_scope("k:n")]))
            return batcher
        finally:
            await client.close()

    try:
        batcher = asyncio.run(run())
        assert (batcher.calls, batcher.requests) == (2, 4)
        assert 0 < batcher.seconds < 4.0
        series = render(batcher)
        assert "switchyard_tenant_admission_seconds_count 2\n" in series
        assert "switchyard_tenant_admission_requests_total 4\n" in series
        assert f"switchyard_tenant_admission_seconds_sum {batcher.seconds:.6f}\n" in series
    finally:
        clean_redis(prefix)


def test_the_batch_body_is_every_argument_as_resp_bulk_strings() -> None:
    """The numbers are encoded inline (no `bulk_int` call per request): the same bytes as `bulk_int`'s,
    negative settlements and zero included, in the order `limits.ADMIT` reads them."""
    sent: list[tuple[int, bytes]] = []

    class _Capture:
        def call(self, argc: int, body: bytes, answer: object) -> None:
            sent.append((argc, body))

    class _Pending:
        def take(self) -> dict[bytes, int]:
            return {bulk("{syt:p}:pa:k:a"): -3, bulk("{syt:p}:tk:k:a:7"): 1234}

    async def run() -> None:
        batcher = AdmitBatcher(_Capture(), 60_000, "r1", "{syt:p}", _Pending())  # type: ignore[arg-type]
        batcher.admit(250, 0, encode_scopes([_scope("k:a")]))
        batcher.admit(7, 123_456_789, encode_scopes([_scope("k:a"), _scope("t:x")]))
        await asyncio.sleep(0)  # the batch goes at the end of the loop's turn

    asyncio.run(run())
    expected = [60_000, "r1", "{syt:p}", 2, "{syt:p}:pa:k:a", -3, "{syt:p}:tk:k:a:7", 1234]
    expected += [1, 250, 0, _scope("k:a"), 2, 7, 123_456_789, _scope("k:a"), _scope("t:x")]
    assert sent == [
        (len(expected), b"".join(bulk(a) if isinstance(a, str) else bulk_int(a) for a in expected))
    ]
