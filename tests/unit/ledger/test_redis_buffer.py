"""The Redis ledger when Redis is away: records stay buffered, overflow is counted, nothing raises."""

from __future__ import annotations

import logging
import time

import pytest

from gateway.config.settings import LedgerOptions
from gateway.ledger.redis_store import RedisLedger
from gateway.openai.errors import GatewayError
from tests.support import free_port
from tests.unit.ledger.test_ledger_contract import rec


def _unreachable(**overrides: object) -> RedisLedger:
    url = f"redis://127.0.0.1:{free_port()}/0"
    options = LedgerOptions(redis_url=url, redis_timeout=0.5, **overrides)  # type: ignore[arg-type]
    return RedisLedger(options)


async def test_records_wait_in_the_buffer_while_redis_is_down() -> None:
    ledger = _unreachable()
    started = time.perf_counter()
    for i in range(50):
        ledger.record(rec(f"r{i}"))
    assert time.perf_counter() - started < 0.05  # no I/O on the request path
    assert await ledger.flush() is False
    stats = ledger.stats()
    assert (stats["buffered"], stats["dropped"], stats["flush_errors"]) == (50, 0, 1)
    assert stats["last_error"]
    await ledger.client.aclose()


async def test_reads_while_redis_is_down_are_a_503_in_openai_shape() -> None:
    ledger = _unreachable()
    with pytest.raises(GatewayError) as totals:
        await ledger.read_totals("key")
    with pytest.raises(GatewayError) as costs:
        await ledger.costs("backend", "15m")
    for error in (totals.value, costs.value):
        assert error.status == 503 and error.body.code == "ledger_unavailable"
        assert error.headers == {"retry-after": "1"}
    await ledger.client.aclose()


async def test_overflow_is_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    ledger = _unreachable(buffer_max=10)
    with caplog.at_level(logging.ERROR, logger="switchyard.ledger"):
        for i in range(15):
            ledger.record(rec(f"r{i}"))
    assert (ledger.stats()["buffered"], ledger.stats()["dropped"]) == (10, 5)
    assert "dropped" in caplog.text
    await ledger.client.aclose()


async def test_close_gives_up_after_a_deadline_and_says_so(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gateway.ledger.redis_store._CLOSE_DEADLINE_S", 0.3)
    ledger = _unreachable()
    ledger.record(rec("lost"))
    with caplog.at_level(logging.ERROR, logger="switchyard.ledger"):
        started = time.monotonic()
        await ledger.close()
    assert time.monotonic() - started < 3
    assert "1 record could not be written to Redis at shutdown and is lost" in caplog.text


def test_store_choice() -> None:
    from gateway.ledger.factory import NullLedger, build_ledger
    from gateway.ledger.memory import InMemoryLedger

    assert isinstance(build_ledger(LedgerOptions(), []), InMemoryLedger)
    assert isinstance(build_ledger(LedgerOptions(redis_url="redis://127.0.0.1:1"), []), RedisLedger)
    assert isinstance(build_ledger(LedgerOptions(store="none"), []), NullLedger)
    memory = LedgerOptions(store="memory", redis_url="redis://127.0.0.1:1")
    assert isinstance(build_ledger(memory, []), InMemoryLedger)
