"""Cost gauges on /metrics (paid = allocated + idle); the client request id in the access log."""

from __future__ import annotations

import re

import pytest

from gateway.config.settings import LedgerOptions
from gateway.ledger.memory import InMemoryLedger
from gateway.telemetry.metrics import Metrics
from tests.unit.ledger.test_ledger_contract import NOW, T0, _backends, rec


def _gauges(text: str, kind: str) -> dict[str, float]:
    pattern = rf'^switchyard_backend_{kind}_usd_per_hour{{backend="([^"]+)".*}} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.M)}


async def test_paid_allocated_and_idle_per_hour() -> None:
    backends = _backends()
    ledger = InMemoryLedger(options=LedgerOptions(), backends=backends, clock=lambda: NOW)
    metrics = Metrics(backends, ledger=ledger)
    assert _gauges(metrics.render().decode(), "paid") == {
        "nv-0": 0,
        "nv-1": 0,
        "amd-0": 0,
    }  # before any refresh
    await ledger.tick(now=T0)
    await ledger.tick(now=NOW)
    ledger.record(rec("a"))  # 9 s of nv-0's 90 s, all within its bound
    await ledger.refresh()
    text = metrics.render().decode()
    paid, allocated, idle = (_gauges(text, kind) for kind in ("paid", "allocated", "idle"))
    assert paid["nv-0"] == pytest.approx(3.6) and paid["amd-0"] == pytest.approx(3.6)  # 2 GPUs x $1.80
    assert allocated["nv-0"] == pytest.approx(3.6 * 9 / 90)
    for name in paid:
        assert allocated[name] + idle[name] == pytest.approx(paid[name])
    assert 'switchyard_ledger_idle_cost_info{mode="idle"} 1' in text


def test_the_access_log_keeps_the_client_request_id_apart() -> None:
    import dataclasses
    import io
    import json

    from gateway.telemetry.logs import AccessLog

    out = io.BytesIO()
    log = AccessLog(out)
    log.record(dataclasses.replace(rec("req-gw"), client_request_id="client-7"), None)
    log.record(rec("req-gw2"), None)
    log.flush()
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert (first["request_id"], first["client_request_id"]) == ("req-gw", "client-7")
    assert "client_request_id" not in second
