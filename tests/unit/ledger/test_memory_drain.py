"""The in-memory ledger aggregates its queued records a slice at a time on the ticker and on reads, so a
second of traffic does not hold the event loop: and it still counts every record once."""

from __future__ import annotations

import asyncio

from gateway.config.settings import LedgerOptions
from gateway.ledger.memory import DRAIN_SLICE, InMemoryLedger
from tests.unit.ledger.test_ledger_contract import NOW, _backends, rec

RECORDS = 5 * DRAIN_SLICE + 17


def _ledger() -> InMemoryLedger:
    return InMemoryLedger(options=LedgerOptions(), backends=_backends(), clock=lambda: NOW)


async def test_a_tick_lets_requests_run_while_it_drains_and_counts_each_record_once() -> None:
    ledger = _ledger()
    await ledger.tick(NOW - 30)  # the replica's start: the next tick has paid time to claim
    for i in range(RECORDS):
        ledger.record(rec(f"r-{i}"))
    turns = 0
    stop = asyncio.Event()

    async def request_path() -> None:
        nonlocal turns
        while not stop.is_set():
            turns += 1
            if turns == 3:  # a read between two slices takes the rest at once, and a newcomer
                ledger.record(rec("late"))
                assert ledger.totals("key")["key-a"].requests == RECORDS + 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(request_path())
    await asyncio.sleep(0)
    await ledger.tick(NOW)
    stop.set()
    await beside
    assert turns >= 3, "the drain never let the request path run"
    totals = (await ledger.read_totals("key"))["key-a"]
    assert totals.requests == RECORDS + 1
    assert totals.prompt_tokens == (RECORDS + 1) * 1000


async def test_one_slice_is_drained_without_yielding() -> None:
    ledger = _ledger()
    for i in range(DRAIN_SLICE):
        ledger.record(rec(f"r-{i}"))
    turns = 0

    async def request_path() -> None:
        nonlocal turns
        turns += 1

    beside = asyncio.create_task(request_path())
    await ledger.read_totals("key")  # the task has not started: no slice was left for later
    assert turns == 0
    await beside
    assert (await ledger.read_totals("key"))["key-a"].requests == DRAIN_SLICE
