"""The console's pure parts: the session token and CSRF token, the origin check, the SVG chart, the mix."""

from __future__ import annotations

import asyncio
import hashlib
import re
import time
from typing import Any

import pytest
from litestar import Request

from backends.models import Backend, Pool
from gateway.console.charts import line_chart, time_labels
from gateway.console.data import CostSeries, Recent, traffic_mix
from gateway.console.pages import budget_bars, fleet_alert
from gateway.console.session import Sessions, same_origin
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import UsageRecord

ADMIN = "sy-admin-material"
HASH = hashlib.sha256(ADMIN.encode()).hexdigest()


def _request(**headers: str) -> Request[Any, Any, Any]:
    raw = [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return Request(
        {"type": "http", "method": "POST", "path": "/console/x", "headers": raw, "query_string": b""}
    )


def test_session_token_is_signed_expires_and_belongs_to_the_admin_key() -> None:
    sessions = Sessions(HASH, lifetime_s=60)
    token = sessions.issue(now=1000.0)
    assert sessions.valid(token, now=1059.0)
    assert not sessions.valid(token, now=1061.0), "an expired session is refused"
    expiry, nonce, mac = token.split(".")
    assert not sessions.valid(f"{int(expiry) + 3600}.{nonce}.{mac}", now=1000.0), "a lengthened expiry"
    assert not sessions.valid(f"{expiry}.{nonce}x.{mac}", now=1000.0)
    assert not sessions.valid("", now=1000.0) and not sessions.valid("a.b", now=1000.0)
    other = Sessions(hashlib.sha256(b"another admin key").hexdigest(), lifetime_s=60)
    assert not other.valid(token, now=1000.0), "a new admin key ends every session"
    assert sessions.is_admin_key(ADMIN) and not sessions.is_admin_key(ADMIN + "x")


def test_csrf_token_is_per_session() -> None:
    sessions = Sessions(HASH)
    first, second = sessions.issue(), sessions.issue()
    assert sessions.csrf_ok(first, sessions.csrf_token(first))
    assert not sessions.csrf_ok(first, sessions.csrf_token(second))
    assert not sessions.csrf_ok(first, None) and not sessions.csrf_ok(first, "")


def test_cookie_is_secure_http_only_and_strict() -> None:
    header = Sessions(HASH).cookie_header("t")
    assert {"Secure", "HttpOnly", "SameSite=Strict", "Path=/console"} <= {
        p.strip() for p in header.split(";")
    }


@pytest.mark.parametrize(
    ("headers", "allowed"),
    [
        ({"host": "gw:8080", "origin": "http://gw:8080"}, True),
        ({"host": "gw:8080", "origin": "https://gw:8080"}, True),
        ({"host": "gw:8080", "referer": "http://gw:8080/console/fleet"}, True),
        ({"host": "gw:8080", "origin": "http://evil:8080"}, False),
        ({"host": "gw:8080", "origin": "http://gw:8081"}, False),
        ({"host": "gw:8080", "origin": "null"}, False),
        ({"host": "gw:8080", "origin": "null", "referer": "http://gw:8080/"}, True),
        ({"host": "gw:8080", "referer": "http://gw:8080.evil/console"}, False),
        ({"host": "gw:8080", "origin": "javascript://gw:8080"}, False),
        ({"host": "gw:8080"}, False),
        ({"origin": "http://gw:8080"}, False),
    ],
)
def test_same_origin(headers: dict[str, str], allowed: bool) -> None:
    assert same_origin(_request(**headers)) is allowed


def test_line_chart_draws_one_point_per_value_and_escapes_names() -> None:
    svg = line_chart("t", ["a", "b", "c"], {"<amd>": [1.0, None, 3.0], "nvidia": [2.0, 2.5, 0.0]})
    assert svg.count("<circle") == 5
    assert svg.count("<polyline") == 2
    assert "<amd>" not in svg and "&lt;amd&gt;" in svg


def test_partial_last_point_is_hollow_and_out_of_the_line() -> None:
    svg = line_chart("t", ["a", "b", "c"], {"amd": [1.0, 2.0, 0.5]}, partial_last=True)
    line = re.search(r'<polyline[^>]*points="([^"]+)"', svg)
    assert line is not None and len(line.group(1).split()) == 2, "the filling bucket is not in the line"
    assert svg.count('class="line partial') == 1 and svg.count("point series-0 partial") == 1
    assert "still filling" in svg


def test_time_labels_date_the_first_and_a_new_day_and_mark_now() -> None:
    start = int(time.mktime((2026, 11, 26, 22, 0, 0, 0, 0, -1)))
    labels = time_labels([start + i * 3600 for i in range(4)], 3600)
    assert labels[0] == "Nov 26 22:00" and labels[-1] == "Nov 27 01:00 (now)"
    texts = re.findall(r"x-label[^>]*>([^<]*)<", line_chart("t", labels, {"a": [1.0] * 4}))
    assert texts == ["Nov 26 22:00", "23:00", "Nov 27 00:00", "01:00 (now)"]


def test_fleet_alert_names_failing_open_and_drained_backends_with_why_and_since() -> None:
    now = 10_000.0

    def row(name: str, **changes: Any) -> dict[str, Any]:
        base = {"name": name, "healthy": True, "routable": True, "breaker": "closed", "draining": False}
        return {**base, **changes}

    view = {"data": [
        row("a"),
        row("b", healthy=False, routable=False, health_failing_since=now - 120),
        row("c", breaker="open", routable=False, breaker_reason="connection refused",
            breaker_opened_at=now - 5),
        row("d", draining=True, routable=False),
    ]}  # fmt: skip
    html = fleet_alert(view, now)
    assert "1/4 backends routable" in html and 'class="fleet-alert bad"' in html
    assert "health check failing since" in html and "(2m ago)" in html
    assert "connection refused" in html and "(5s ago)" in html and "drained by an operator" in html
    assert "<b>a</b>" not in html
    assert "All 1 backends routable" in fleet_alert({"data": [row("a")]}, now)


def test_budget_of_zero_says_refused_and_held_spend_is_apart() -> None:
    html = budget_bars([
        {"id": "k1", "name": "zero", "budget_usd": 0.0, "spent_usd": 0.0},
        {"id": "k2", "name": "busy", "budget_usd": 10.0, "spent_usd": 3.0, "held_usd": 2.0},
    ])  # fmt: skip
    assert "budget $0: every request is refused" in html and "$0.0000 of $0.0000" not in html
    assert "$1.00 of $10.00 (10%)" in html and "+ $2.00 held for requests in flight" in html


def test_traffic_mix_counts_classes_routes_and_vendors_per_minute() -> None:
    now = 6030.0
    records = [
        {"request_class": "chat", "route": "fast", "vendor": "amd", "finished_at": now - 30},
        {"request_class": "chat", "route": "fast", "vendor": "nvidia", "finished_at": now - 90},
        {"request_class": "batch", "route": "cheap", "vendor": "amd", "finished_at": now - 90},
        {"request_class": "batch", "route": "cheap", "vendor": "amd", "finished_at": now - 4000},
    ]
    mix = traffic_mix(records, now, minutes=30)
    assert dict(mix["classes"]) == {"chat": 2, "batch": 2}
    assert mix["split"]["amd"][-1] == 1 and mix["split"]["amd"][-2] == 1
    assert mix["split"]["nvidia"][-2] == 1
    assert sum(mix["split"]["amd"]) == 2, "a record older than the chart is left out of it"


async def test_recent_answers_kept_value_while_refreshing_behind() -> None:
    calls: list[int] = []

    async def compute() -> int:
        calls.append(1)
        await asyncio.sleep(0.01)
        return len(calls)

    recent = Recent(ttl=0.05)
    assert (await recent.get("k", compute))[1] == 1
    assert (await recent.get("k", compute))[1] == 1 and len(calls) == 1
    await asyncio.sleep(0.06)
    assert (await recent.get("k", compute))[1] == 1, "stale: answered at once, refreshed behind"
    await asyncio.sleep(0.03)
    assert (await recent.get("k", compute))[1] == 2


async def test_cost_series_steps_by_the_window_and_keeps_finished_steps() -> None:
    pool = Pool(name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=1, price_per_gpu_hour=3.6,
                labels={})  # fmt: skip
    backend = Backend(
        name="amd-0", url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=4096, pool=pool
    )
    ledger = InMemoryLedger(backends=[backend])
    now = 1_800_000_000.0 + 30  # 30 s into a minute
    for minutes_ago in (0, 2, 4):
        ledger.record(_usage(f"r{minutes_ago}", now - minutes_ago * 60))
    series = CostSeries(ledger)
    starts, rows = await series.series("vendor", 60, 5, now)
    assert starts == [int(now // 60 * 60) - (4 - i) * 60 for i in range(5)], "the current minute last"
    amd = rows["amd"]
    assert [row is not None and row["requests"] for row in amd] == [1, False, 1, False, 1]
    ledger.record(_usage("late", now - 4 * 60))  # a finished minute read before is kept as it was
    _, again = await series.series("vendor", 60, 5, now)
    assert again["amd"][0]["requests"] == 1
    starts, _ = await series.series("vendor", 3600, 24, now)
    assert len(starts) == 24 and starts[-1] == int(now // 3600 * 3600)


def _usage(request_id: str, finished_at: float) -> UsageRecord:
    return UsageRecord(
        request_id=request_id, endpoint="chat", model="m", backend="amd-0", pool="p", vendor="amd",
        accelerator="mi300x", key="", request_class="default", route="default", stream=False, status=200,
        prompt_tokens=100, completion_tokens=10, usage_source="backend", ttft_s=0.1, duration_s=1.0,
        cost_usd=0.001, finished_at=finished_at, busy_s=1.0,
    )  # fmt: skip
