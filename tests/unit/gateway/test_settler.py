"""The settler leaves pending settlements to the admission batches while those flow, and sends them
itself once admissions stop (a fake script client stands in for Redis)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from gateway.redis.script_client import bulk
from gateway.tenants import settler as settler_module
from gateway.tenants.settler import Settler

TK, PA = "{syt:t}:tk:k:1", "{syt:t}:pa:k"
NAMES = ((bulk(TK), bulk(PA), bulk("{syt:t}:sp:k:d"), bulk("{syt:t}:hd:k:d")),)


class _Script:
    def __init__(self) -> None:
        self.calls: list[bytes] = []

    def call(self, argc: int, body: bytes, on_reply: Any, numkeys: int = 0) -> None:
        self.calls.append(body)
        on_reply(numkeys)

    async def close(self) -> None:
        return None


async def test_settlements_ride_on_admission_batches_while_they_flow(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(settler_module, "BATCH_DELAY_S", 0.2)  # wide, for a busy machine
    client = aioredis.Redis()
    settler = Settler(client, 1.0, "replica", "{syt:t}")
    script = _Script()
    settler._script = script  # type: ignore[assignment]
    settler.start()
    try:
        taken: dict[bytes, int] = {}
        for _ in range(30):  # an admission batch every 10 ms takes what ended before it
            for counter, delta in settler.take().items():
                taken[counter] = taken.get(counter, 0) + delta
            settler.settle(NAMES, 5, 7, -7)
            await asyncio.sleep(0.01)
        assert script.calls == []  # no SETTLE call of its own meanwhile
        assert taken[bulk(PA)] == -29 and taken[bulk(TK)] == 5 * 29
        # Admissions stop: the last settlement goes in the settler's own call.
        deadline = asyncio.get_running_loop().time() + 3
        while not script.calls:
            assert asyncio.get_running_loop().time() < deadline, "the settler never sent it"
            await asyncio.sleep(0.02)
        assert len(script.calls) == 1 and settler.pending() == 0
        assert b"{syt:t}:pa:k" in script.calls[0]
    finally:
        await settler.close()
        await client.aclose()
