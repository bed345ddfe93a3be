"""The in-memory ledger's totals, and how `account()` turns a served request into a record."""

from __future__ import annotations

import dataclasses

import pytest

from backends.models import Backend, Pool
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import DIMENSIONS, UsageRecord
from gateway.openai.responses import Usage
from gateway.request.account import Served, account, estimate_cost
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse


def _record(request_id: str, **fields: object) -> UsageRecord:
    values: dict[str, object] = {
        "request_id": request_id,
        "endpoint": "chat",
        "model": "llama",
        "backend": "amd-0",
        "pool": "mi300x",
        "vendor": "amd",
        "accelerator": "mi300x",
        "key": "key-a",
        "request_class": "default",
        "route": "least-inflight",
        "stream": False,
        "status": 200,
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "usage_source": "backend",
        "ttft_s": 0.1,
        "duration_s": 1.0,
        "cost_usd": 0.01,
        "finished_at": 1.0,
    }
    values.update(fields)
    return UsageRecord(**values)  # type: ignore[arg-type]


RECORDS = [
    _record("r1"),
    _record("r2", backend="amd-1", prompt_tokens=20, completion_tokens=7, cost_usd=0.02, key="key-b"),
    _record(
        "r3",
        backend="nv-0",
        pool="h100",
        vendor="nvidia",
        accelerator="h100",
        prompt_tokens=30,
        completion_tokens=0,
        cost_usd=0.03,
        status=504,
        usage_source="estimated",
    ),
    _record("r4", model="qwen", backend="nv-0", pool="h100", vendor="nvidia", usage_source="estimated"),
]


@pytest.fixture
def ledger() -> InMemoryLedger:
    ledger = InMemoryLedger()
    for record in RECORDS:
        ledger.record(record)
    return ledger


@pytest.mark.parametrize("dim", DIMENSIONS)
def test_totals_per_dimension_add_up(ledger: InMemoryLedger, dim: str):
    totals = ledger.totals(dim)  # type: ignore[arg-type]
    assert sum(t.requests for t in totals.values()) == 4
    assert sum(t.prompt_tokens for t in totals.values()) == 70
    assert sum(t.completion_tokens for t in totals.values()) == 17
    assert sum(t.cost_usd for t in totals.values()) == pytest.approx(0.07)
    assert sum(t.errors for t in totals.values()) == 1
    assert sum(t.estimated for t in totals.values()) == 2


def test_totals_by_name(ledger: InMemoryLedger):
    by_vendor = ledger.totals("vendor")
    assert set(by_vendor) == {"amd", "nvidia"}
    amd, nvidia = by_vendor["amd"], by_vendor["nvidia"]
    assert (amd.requests, amd.prompt_tokens, amd.completion_tokens) == (2, 30, 12)
    assert (amd.errors, amd.estimated) == (0, 0)
    assert amd.total_tokens == 42
    assert amd.cost_usd == pytest.approx(0.03)
    assert (nvidia.requests, nvidia.errors, nvidia.estimated) == (2, 1, 2)
    assert nvidia.total_tokens == 45
    assert set(ledger.totals("backend")) == {"amd-0", "amd-1", "nv-0"}
    assert ledger.totals("backend")["nv-0"].requests == 2
    assert ledger.totals("model")["qwen"].requests == 1
    assert ledger.totals("key")["key-b"].prompt_tokens == 20
    assert ledger.totals("pool")["h100"].cost_usd == pytest.approx(0.04)


def test_repeated_request_id_counted_once(ledger: InMemoryLedger):
    ledger.record(_record("r1", prompt_tokens=1000))
    ledger.record(RECORDS[0])
    assert ledger.totals("model")["llama"].requests == 3
    assert ledger.totals("model")["llama"].prompt_tokens == 60
    assert [r.request_id for r in ledger.recent(10)] == ["r1", "r2", "r3", "r4"]


def test_recent(ledger: InMemoryLedger):
    assert [r.request_id for r in ledger.recent(2)] == ["r3", "r4"]
    assert [r.request_id for r in ledger.recent(100)] == ["r1", "r2", "r3", "r4"]
    assert ledger.recent(0) == []
    assert ledger.recent(-1) == []


def test_recent_is_bounded():
    ledger = InMemoryLedger(keep_recent=3)
    for i in range(5):
        ledger.record(_record(f"r{i}"))
    assert [r.request_id for r in ledger.recent(10)] == ["r2", "r3", "r4"]
    assert ledger.totals("model")["llama"].requests == 5  # totals are not bounded


def test_returned_totals_are_copies(ledger: InMemoryLedger):
    totals = ledger.totals("vendor")
    totals["amd"].requests = 999
    totals["amd"].cost_usd = 123.0
    totals["intel"] = dataclasses.replace(totals["amd"])
    fresh = ledger.totals("vendor")
    assert fresh["amd"].requests == 2
    assert fresh["amd"].cost_usd == pytest.approx(0.03)
    assert "intel" not in fresh


def test_empty_ledger():
    ledger = InMemoryLedger()
    assert all(ledger.totals(dim) == {} for dim in DIMENSIONS)
    assert ledger.recent(5) == []


async def test_close_is_harmless(ledger: InMemoryLedger):
    await ledger.close()
    assert ledger.recent(1)[0].request_id == "r4"


# --- account() --------------------------------------------------------------------------------------------

POOL = Pool(
    name="mi300x", vendor="amd", accelerator="mi300x", gpus_per_backend=2, price_per_gpu_hour=3.6, labels={}
)


def _backend() -> Backend:
    return Backend(
        name="amd-0", url="http://127.0.0.1:1", models=frozenset({"llama"}), max_model_len=8192, pool=POOL
    )


def _served(usage: Usage | None, events: int = 0, concurrency: int = 1, status: int = 200) -> Served:
    return Served(
        backend=_backend(),
        concurrency=concurrency,
        status=status,
        usage=usage,
        completion_events=events,
        started_at=100.0,
        first_byte_at=100.25,
        ended_at=102.0,
    )


PARSED = parse(
    "chat", b'{"model":"llama","messages":[{"role":"user","content":"' + b"x" * 41 + b'"}],"stream":true}'
)
PROFILE = classify(PARSED, Caller("req-1", "Bearer sk-abc", {}))


def test_account_uses_backend_usage_when_present():
    ledger = InMemoryLedger()
    record = account(
        ledger, _caller("req-1"), PARSED, PROFILE, "least-inflight", _served(Usage(12, 34, 46), events=99)
    )
    assert (record.prompt_tokens, record.completion_tokens, record.usage_source) == (12, 34, "backend")
    assert ledger.recent(1) == [record]
    assert record.request_id == "req-1"
    assert (record.model, record.backend, record.pool, record.vendor, record.accelerator) == (
        "llama",
        "amd-0",
        "mi300x",
        "amd",
        "mi300x",
    )
    assert record.key == PROFILE.key_id and record.key.startswith("key-")
    assert record.route == "least-inflight"
    assert record.stream is True
    assert record.ttft_s == pytest.approx(0.25)
    assert record.duration_s == pytest.approx(2.0)


def test_account_estimates_without_usage():
    ledger = InMemoryLedger()
    record = account(ledger, _caller("req-2"), PARSED, PROFILE, "r", _served(None, events=8, status=504))
    # prompt: ceil(41 / 4) = 11; completion: one token per event minus the [DONE] event
    assert (record.prompt_tokens, record.completion_tokens, record.usage_source) == (11, 7, "estimated")
    assert record.status == 504
    totals = ledger.totals("backend")["amd-0"]
    assert (totals.estimated, totals.errors) == (1, 1)


def test_account_estimate_never_negative():
    record = account(InMemoryLedger(), _caller("req-3"), PARSED, PROFILE, "r", _served(None, events=0))
    assert record.completion_tokens == 0


@pytest.mark.parametrize("concurrency", [1, 2, 5])
def test_attributed_cost(concurrency: int):
    record = account(
        InMemoryLedger(),
        _caller("req-c"),
        PARSED,
        PROFILE,
        "r",
        _served(Usage(1, 1, 2), concurrency=concurrency),
    )
    # price/h x gpus x duration / 3600 / concurrency
    assert record.cost_usd == pytest.approx(3.6 * 2 * 2.0 / 3600 / concurrency)


def _caller(request_id: str, client_request_id: str | None = None) -> Caller:
    return Caller(request_id, "Bearer sk-abc", {}, client_request_id=client_request_id)


def test_estimate_cost_before_the_backend_is_measured_is_a_time_share():
    backend = _backend()
    ledger = InMemoryLedger()
    assert estimate_cost(ledger, backend, 1, 1, 3600.0, 1) == pytest.approx(7.2)
    assert estimate_cost(ledger, backend, 1, 1, 3600.0, 4) == pytest.approx(1.8)
    assert estimate_cost(ledger, backend, 1, 1, 3600.0, 0) == pytest.approx(7.2)  # never divides by zero
    assert estimate_cost(ledger, backend, 1, 1, 0.0, 1) == 0.0


def test_estimate_cost_at_the_measured_rate_never_exceeds_the_requests_bound():
    backend = _backend()
    ledger = InMemoryLedger()
    ledger._rates["amd-0"] = 1e-6  # USD per weighted token, as the refresher sets it
    assert estimate_cost(ledger, backend, 100, 10, 3600.0, 1) == pytest.approx(140e-6)
    # an idle backend's measured rate is enormous: the estimate stops at price x GPUs x duration
    ledger._rates["amd-0"] = 1.0
    assert estimate_cost(ledger, backend, 100, 10, 2.0, 1) == pytest.approx(7.2 * 2.0 / 3600)


def test_account_keeps_the_client_request_id_apart_and_the_bound():
    record = account(
        InMemoryLedger(), _caller("req-x", "client-1"), PARSED, PROFILE, "r", _served(Usage(1, 1, 2))
    )
    assert (record.request_id, record.client_request_id) == ("req-x", "client-1")
    assert record.bound_nusd == int(7.2 / 3600 * 2.0 * 1e9)


def test_account_clock_going_backwards_costs_nothing():
    served = dataclasses.replace(_served(Usage(1, 1, 2)), ended_at=99.0, first_byte_at=None)
    record = account(InMemoryLedger(), _caller("req-b"), PARSED, PROFILE, "r", served)
    assert record.duration_s == 0.0
    assert record.cost_usd == 0.0
    assert record.ttft_s is None


def test_account_fills_every_field_by_its_name():
    """`account` builds the record by position: each field holds what its name says."""
    caller = Caller("req-9", "Bearer sk-abc", {}, priority="high", explicit_class="batch", tenant="t-1")
    caller.session, caller.client_request_id = "s-1", "client-9"
    profile = classify(PARSED, caller)
    served = _served(Usage(12, 34, 46), concurrency=2, status=201)
    record = account(InMemoryLedger(), caller, PARSED, profile, "least-inflight", served)
    cost = estimate_cost(InMemoryLedger(), served.backend, 12, 34, 2.0, 2)
    expected = UsageRecord(
        request_id="req-9",
        endpoint="chat",
        model="llama",
        backend="amd-0",
        pool="mi300x",
        vendor="amd",
        accelerator="mi300x",
        key=profile.key_id,
        request_class=profile.request_class,
        route="least-inflight",
        stream=True,
        status=201,
        prompt_tokens=12,
        completion_tokens=34,
        usage_source="backend",
        ttft_s=0.25,
        duration_s=2.0,
        cost_usd=cost,
        finished_at=record.finished_at,
        busy_s=1.0,
        prompt_estimate=profile.prompt_tokens_estimate,
        max_tokens=profile.max_tokens,
        n=profile.n,
        priority="high",
        class_header="batch",
        tenant="t-1",
        session="s-1",
        bound_nusd=int(POOL.backend_price_per_second * 2.0 * 1e9),
        client_request_id="client-9",
        prompt_chars=PARSED.prompt_chars,
    )
    assert dataclasses.asdict(record) == dataclasses.asdict(expected)
    assert len({f.name for f in dataclasses.fields(UsageRecord)}) == 33  # a new field: add it to `account`
