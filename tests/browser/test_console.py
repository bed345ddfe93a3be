"""The console, logged in, in headless chromium: every page renders without a console error, the drain
button moves traffic off a backend on both replicas, a key made in the console works and stops working
when revoked there, and the charts draw their points."""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.browser.harness import MODEL, Replicas, login, save_screenshot

PAGES = ("fleet", "costs", "routing", "keys")


def _served_by(url: str, key: str, n: int) -> Counter[str]:
    """Send `n` chat requests through the OpenAI SDK; count the backend that answered each."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    served: Counter[str] = Counter()
    for _ in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        raw.parse()
        served[raw.headers["x-switchyard-backend"]] += 1
    client.close()
    return served


def _streamed(url: str, key: str, n: int) -> None:
    """Streams give the gateway each backend's time to first token and time per token."""
    client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=30)
    for _ in range(n):
        chunks = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=24, stream=True
        )
        assert any(chunk.choices and chunk.choices[0].delta.content for chunk in chunks)
    client.close()


def test_every_page_renders_without_console_errors(
    replicas: Replicas, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    _served_by(replicas.urls[0], replicas.traffic_key, 12)
    _streamed(replicas.urls[0], replicas.traffic_key, 12)
    login(new_page, replicas.urls[0])
    for slug in PAGES:
        response = new_page.goto(f"{replicas.urls[0]}/console/{slug}")
        assert response.status == 200
        new_page.wait_for_load_state("networkidle")
        assert new_page.locator("h1").inner_text().lower() == slug
        save_screenshot(new_page, screenshots, slug)
    assert console_errors == []
    fleet = new_page.goto(f"{replicas.urls[0]}/console/fleet")
    assert fleet is not None
    for backend in ("h100-0", "h100-1", "mi300x-0", "mi300x-1"):
        assert new_page.locator("td .name", has_text=backend).count() == 1
    ttft = new_page.locator("table.backends tbody tr td:nth-child(7)").all_inner_texts()
    assert any(text.endswith(" ms") for text in ttft), f"no recent TTFT shown: {ttft}"


def test_charts_draw_data_points(replicas: Replicas, new_page: Any, console_errors: list[str]) -> None:
    _served_by(replicas.urls[1], replicas.traffic_key, 8)
    login(new_page, replicas.urls[1])
    new_page.goto(replicas.urls[1] + "/console/costs?window=24h")
    spend = new_page.locator("svg.chart").first
    # A day of seeded history: a point per vendor per quarter hour (96 a day, two vendors).
    assert spend.locator("circle.point").count() >= 2 * 23
    assert spend.locator("polyline").count() == 2
    points = spend.locator("circle.point").evaluate_all("cs => cs.map(c => Number(c.getAttribute('cy')))")
    assert len(set(points)) > 2, "the points all sit at one height: no data drawn"
    new_page.goto(replicas.urls[1] + "/console/routing")
    split = new_page.locator("svg.chart").first
    assert split.locator("circle.point").count() >= 1
    assert console_errors == []


def test_fleet_refreshes_itself_without_reloading(replicas: Replicas, new_page: Any) -> None:
    login(new_page, replicas.urls[0])
    new_page.evaluate("window.__marker = 1")
    first = new_page.locator(".summary").inner_text()
    new_page.wait_for_function(
        "first => document.querySelector('.summary').innerText !== first", arg=first, timeout=8000
    )
    assert new_page.evaluate("window.__marker") == 1, "the page reloaded instead of refreshing a fragment"


def test_drain_button_moves_traffic_off_the_backend_on_every_replica(
    replicas: Replicas, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    before = _served_by(replicas.urls[0], replicas.traffic_key, 16) + _served_by(
        replicas.urls[1], replicas.traffic_key, 16
    )
    target = before.most_common(1)[0][0]
    login(new_page, replicas.urls[0])
    row = new_page.locator("table.backends tr", has=new_page.locator(".name", has_text=target))
    new_page.on("dialog", lambda dialog: dialog.accept())  # Drain asks first
    row.locator("button.drain").click()
    row.locator("button.undrain").wait_for(timeout=5000)
    try:
        # The other replica's console shows the drain too (the fleet view through Redis).
        other = new_page.context.new_page()
        other.goto(replicas.urls[1] + "/console/fleet")
        other_row = other.locator("table.backends tr", has=other.locator(".name", has_text=target))
        other_row.locator("button.undrain").wait_for(timeout=5000)
        save_screenshot(new_page, screenshots, "fleet-drained")
        after = _served_by(replicas.urls[0], replicas.traffic_key, 20) + _served_by(
            replicas.urls[1], replicas.traffic_key, 20
        )
        assert sum(after.values()) == 40
        assert after[target] == 0, f"the drained {target} still got traffic: {after}"
    finally:
        row.locator("button.undrain").click()
        row.locator("button.drain").wait_for(timeout=5000)
    deadline = time.monotonic() + 5
    while _served_by(replicas.urls[1], replicas.traffic_key, 12)[target] == 0:
        assert time.monotonic() < deadline, "the undrained backend got no traffic back"
    assert console_errors == []


def test_key_created_in_the_console_works_and_revoked_there_is_refused(
    replicas: Replicas, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    login(new_page, replicas.urls[0])
    new_page.goto(replicas.urls[0] + "/console/keys")
    name = f"console-{int(time.time() * 1000)}"
    new_page.fill("#create-key input[name=name]", name)
    new_page.fill("#create-key input[name=budget_usd]", "2.5")
    new_page.fill("#create-key input[name=rpm]", "600")
    new_page.click("#create-key button[type=submit]")
    shown = new_page.locator("#new-key-value")
    shown.wait_for(state="visible")
    material = shown.inner_text()
    assert material.startswith("sy-")
    row = new_page.locator("table.keys tr", has_text=name)
    row.wait_for()
    assert row.locator("meter").count() == 1
    save_screenshot(new_page, screenshots, "keys-created")
    for url in replicas.urls:
        assert sum(_served_by(url, material, 2).values()) == 2
    # The key is shown once: a reload does not show it again.
    new_page.reload()
    assert material not in new_page.content()
    new_page.on("dialog", lambda dialog: dialog.accept())
    new_page.locator("table.keys tr", has_text=name).locator("button.revoke").click()
    new_page.locator("table.keys tr", has_text=name).locator(".state", has_text="revoked").wait_for()
    for url in replicas.urls:
        deadline = time.monotonic() + 3
        while True:
            try:
                _served_by(url, material, 1)
            except openai.AuthenticationError:
                break
            assert time.monotonic() < deadline, f"{url} still accepts the revoked key"
            time.sleep(0.1)
    assert console_errors == []


def test_explain_form_shows_class_candidates_scores_and_pick(
    replicas: Replicas, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    login(new_page, replicas.urls[1])
    new_page.goto(replicas.urls[1] + "/console/routing")
    new_page.click("#explain button[type=submit]")
    result = new_page.locator("#explain-result table.candidates")
    result.wait_for()
    assert result.locator("tbody tr").count() == 4
    pick = new_page.locator("#explain-result b.pick").first.inner_text()
    assert pick in {"h100-0", "h100-1", "mi300x-0", "mi300x-1"}
    save_screenshot(new_page, screenshots, "routing-explain")
    new_page.fill(
        "#explain textarea", '{"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}'
    )
    new_page.click("#explain button[type=submit]")
    new_page.locator("#explain-error").wait_for()
    assert "no-such-model" in new_page.locator("#explain-error").inner_text()
    # The refusal above came back as a 4xx answer the script handled: the page logged it, nothing broke.
    assert all("404" in e or "400" in e for e in console_errors), console_errors


@pytest.mark.parametrize("slug", PAGES)
def test_logout_ends_the_session(replicas: Replicas, new_page: Any, slug: str) -> None:
    login(new_page, replicas.urls[0])
    new_page.goto(f"{replicas.urls[0]}/console/{slug}")
    new_page.click(".logout button")
    new_page.wait_for_url(replicas.urls[0] + "/console/login")
    assert new_page.goto(f"{replicas.urls[0]}/console/{slug}").status == 401


def test_costs_show_price_utilisation_and_rates_with_one_meaning_of_spend(
    replicas: Replicas, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    login(new_page, replicas.urls[0])
    new_page.goto(replicas.urls[0] + "/console/costs?window=24h")
    vendors = new_page.locator("table.by-vendor")
    headers = [h.upper() for h in vendors.locator("th").all_inner_texts()]
    for wanted in ("$/GPU-HOUR", "UTILISATION", "PAID", "ALLOCATED", "IDLE", "$/M IN", "$/M OUT",
                   "$/M BLENDED", "$/M AT 100%"):  # fmt: skip
        assert wanted in headers, headers
    amd = vendors.locator("tr", has_text="amd").locator("td").all_inner_texts()
    assert amd[headers.index("$/GPU-HOUR")] == "$1.75"
    assert amd[headers.index("UTILISATION")].endswith("%")
    assert amd[headers.index("$/M IN")] != amd[headers.index("$/M OUT")], "no input/output split"
    page_headers = [h.upper() for h in new_page.locator("table.costs th").all_inner_texts()]
    assert "SPEND" not in page_headers, "`spend` is named as paid, allocated or idle"
    keys = new_page.locator("table.by-key tbody tr").all_inner_texts()
    assert keys and "idle" not in keys[0], "the idle share tops the key table"
    assert any("idle: paid, used by no request" in row for row in keys)
    assert "CHARGED TO THE BUDGET" in new_page.locator("table.budgets").inner_text().upper()
    assert console_errors == []


def test_cost_charts_follow_the_window_fill_their_panel_and_label_time(
    replicas: Replicas, new_page: Any, screenshots: Path
) -> None:
    login(new_page, replicas.urls[0])
    labels: dict[str, list[str]] = {}
    points: dict[str, int] = {}
    for window in ("24h", "1h"):
        new_page.goto(f"{replicas.urls[0]}/console/costs?window={window}")
        chart = new_page.locator("svg.chart").first
        labels[window] = chart.locator("text.x-label").all_text_contents()
        points[window] = chart.locator("circle.point").count()
        assert labels[window][-1].endswith("(now)"), labels[window]
        assert re.match(r"[A-Z][a-z]{2} \d\d \d\d:\d\d", labels[window][0]), "no date on the first label"
        panel = chart.evaluate("svg => svg.closest('section').clientWidth")
        assert chart.bounding_box()["width"] >= 0.9 * panel, "the chart leaves its panel empty"
        partial = chart.locator("circle.point.partial")
        assert partial.count() >= 1, "the filling bucket is not drawn as partial"
        assert "still filling" in (partial.first.locator("title").text_content() or "")
        if window == "24h":
            save_screenshot(new_page, screenshots, "costs")
    assert points["24h"] >= 2 * 90, "a day of data is drawn in quarter hours: many points per vendor"
    assert labels["1h"] != labels["24h"], "the chart ignores the window"
    assert points["1h"] >= 2 * 30, "the last hour is drawn per minute"


def test_routing_chart_draws_the_current_minute_as_partial(replicas: Replicas, new_page: Any) -> None:
    _served_by(replicas.urls[0], replicas.traffic_key, 4)
    login(new_page, replicas.urls[0])
    new_page.goto(replicas.urls[0] + "/console/routing")
    split = new_page.locator("svg.chart").first
    assert split.locator("line.partial").count() + split.locator("circle.partial").count() >= 1
    assert split.locator("text.x-label").all_text_contents()[-1].endswith("(now)")


def test_breaker_opened_by_failing_requests_is_shown_with_its_reason(
    replicas: Replicas, new_page: Any, screenshots: Path
) -> None:
    target = replicas.fleet.backends[0]
    faults = f"{target.url}/sim/faults"
    httpx.post(faults, json={"error_rate": 1.0, "error_status": 503}, trust_env=False).raise_for_status()
    try:
        client = openai.OpenAI(base_url=replicas.urls[0] + "/v1", api_key=replicas.traffic_key, max_retries=0)
        with replicas.admin(0) as admin:
            deadline = time.monotonic() + 20
            while True:
                with contextlib.suppress(openai.APIError):
                    client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
                    )
                rows = {r["name"]: r for r in admin.get("/admin/v1/backends").json()["data"]}
                if rows[target.name]["breaker"] == "open":
                    break
                assert time.monotonic() < deadline, f"the breaker did not open: {rows[target.name]}"
        client.close()
        login(new_page, replicas.urls[0])
        alert = new_page.locator("#fleet-alert").inner_text()
        assert target.name in alert and "breaker open" in alert and "503" in alert, alert
        row = new_page.locator("table.backends tr", has=new_page.locator(".name", has_text=target.name))
        assert re.search(r"opened \d+\u00d7", row.inner_text()), row.inner_text()
        assert "failing" in (row.get_attribute("class") or ""), "an open breaker's row is not marked"
        save_screenshot(new_page, screenshots, "fleet-breaker-open")
    finally:
        httpx.post(faults, json={"reset": True}, trust_env=False).raise_for_status()


def test_budget_shows_what_requests_in_flight_hold_apart_from_settled_spend(
    replicas: Replicas, new_page: Any
) -> None:
    """While a slow request is in flight its reservation is shown as held, not as spent; once it ends the
    held part is gone and the settled spend has grown by its real cost only."""
    slow = [f"{b.url}/sim/faults" for b in replicas.fleet.backends]
    for url in slow:
        httpx.post(url, json={"added_latency_ms": 4000}, trust_env=False).raise_for_status()
    login(new_page, replicas.urls[0])
    try:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(_served_by, replicas.urls[0], replicas.traffic_key, 1)
            with replicas.admin(0) as admin:
                deadline = time.monotonic() + 3
                listed = admin.get("/admin/v1/keys").json()["data"]
                key_id = next(k["id"] for k in listed if k["name"] == "traffic")
                while True:
                    traffic = admin.get(f"/admin/v1/keys/{key_id}").json()
                    if traffic["held_usd"] > 0 or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
            assert traffic["held_usd"] > 0, traffic
            new_page.goto(replicas.urls[0] + "/console/keys")
            row = new_page.locator("table.keys tbody tr", has_text="traffic").inner_text()
            assert "held" in row, row
            new_page.goto(replicas.urls[0] + "/console/costs")
            assert "held for requests in flight" in new_page.locator("table.budgets").inner_text()
            pending.result(timeout=30)
    finally:
        for url in slow:
            httpx.post(url, json={"reset": True}, trust_env=False).raise_for_status()
    with replicas.admin(0) as admin:
        deadline = time.monotonic() + 5
        listed = admin.get("/admin/v1/keys").json()["data"]
        key_id = next(k["id"] for k in listed if k["name"] == "traffic")
        while True:
            traffic = admin.get(f"/admin/v1/keys/{key_id}").json()
            if traffic["held_usd"] == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    assert traffic["held_usd"] == 0, "the settled request still holds its reservation"
    assert traffic["spent_usd"] > 0
