"""`limits.ADMIT` with many requests in one call (`AdmitBatcher`, one event-loop turn): each request is
judged as if alone, against the counters as the ones before it in the batch left them, on the real Redis."""

from __future__ import annotations

import asyncio
import uuid

import redis

from gateway.redis.script_client import ScriptClient
from gateway.tenants.admit_batch import AdmitBatcher, encode_scopes
from gateway.tenants.answers import verdict_of
from gateway.tenants.limits import ADMIT


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
    ns = "{syt:test-admit-" + uuid.uuid4().hex[:8] + "}"
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
        names = list(shared.scan_iter(match=ns + "*"))
        if names:
            shared.delete(*names)
        shared.close()
