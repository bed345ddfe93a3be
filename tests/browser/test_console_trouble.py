"""What an operator must see at a glance, in chromium: a backend that fails its health check is named,
with why and since when, at the top of every page, its row is marked and its figures are not shown as
current; Drain asks first; the fleet's tables line up and fit at 800 px; explain's errors show beside its
form; keys can be searched, filtered and copied, and the new key is cleared once copied or revoked."""

from __future__ import annotations

import contextlib
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.harness import ADMIN_KEY, clean_redis, gateway_config, login, save_screenshot
from tests.support import RecordingBackend, free_port, running_gateway

MODEL = "echo-model"
PAGES = ("fleet", "costs", "routing", "keys")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A gateway with a pool of two live backends and a pool whose one backend nothing answers for."""
    prefix = f"btest-trouble-{uuid.uuid4().hex[:10]}"
    dead = f"http://127.0.0.1:{free_port()}"
    try:
        with RecordingBackend(MODEL) as backend, contextlib.ExitStack() as stack:

            def member(name: str, url: str) -> dict[str, Any]:
                return {"name": name, "url": url, "models": [MODEL], "max_model_len": 4096}

            pools = [
                {"name": "h100", "vendor": "nvidia", "accelerator": "h100", "price_per_gpu_hour": 2.90,
                 "gpus_per_backend": 8,
                 "backends": [member("h100-0", backend.url), member("h100-1", backend.url)]},
                {"name": "mi300x", "vendor": "amd", "accelerator": "mi300x", "price_per_gpu_hour": 1.75,
                 "backends": [member("mi300x-hung", dead)]},
            ]  # fmt: skip
            workdir = tmp_path_factory.mktemp("console-trouble")
            config = {**gateway_config(pools, prefix, workdir), "policy": {"file": "capacity-first"}}
            base = stack.enter_context(
                running_gateway(config, workdir, env={"SWITCHYARD_ADMIN_KEY": ADMIN_KEY})
            )
            with _admin(base) as admin:
                for _ in range(100):
                    rows = {r["name"]: r for r in admin.get("/admin/v1/backends").json()["data"]}
                    if not rows["mi300x-hung"]["healthy"]:
                        break
                    time.sleep(0.1)
                assert not rows["mi300x-hung"]["healthy"], "the dead backend still passes its health check"
            yield base
    finally:
        clean_redis(prefix)


def _admin(base: str) -> httpx.Client:
    headers = {"authorization": f"Bearer {ADMIN_KEY}"}
    return httpx.Client(base_url=base, headers=headers, trust_env=False, timeout=10)


def test_failing_backend_is_named_with_why_and_since_on_every_page(
    gateway: str, new_page: Any, console_errors: list[str], screenshots: Path
) -> None:
    login(new_page, gateway)
    for slug in PAGES:
        new_page.goto(f"{gateway}/console/{slug}")
        alert = new_page.locator("#fleet-alert")
        text = alert.inner_text()
        assert "mi300x-hung" in text, f"{slug}: {text}"
        assert "health check failing since" in text and "ago" in text, f"{slug}: {text}"
        assert "2/3 backends routable" in text, f"{slug}: {text}"
        assert "h100-0" not in text, "a healthy backend is not listed as trouble"
    new_page.goto(f"{gateway}/console/fleet")
    row = new_page.locator("table.backends tr.failing")
    assert row.count() == 1 and "mi300x-hung" in row.inner_text()
    # A failing backend's load figures are not shown as current.
    assert row.locator(".stale").count() >= 2
    assert "0%" not in row.inner_text()
    background = row.locator("td").first.evaluate("td => getComputedStyle(td).backgroundColor")
    healthy = new_page.locator("table.backends tr", has_text="h100-0").locator("td").first
    assert background != healthy.evaluate("td => getComputedStyle(td).backgroundColor"), "row not marked"
    assert "1/1 routable" not in new_page.locator("section.pool", has_text="mi300x").inner_text()
    save_screenshot(new_page, screenshots, "fleet-failing")
    assert console_errors == []


def test_fleet_shows_price_per_gpu_hour_and_breaker_openings(gateway: str, new_page: Any) -> None:
    login(new_page, gateway)
    heading = new_page.locator("section.pool h2", has_text="h100").inner_text()
    assert "$2.90/GPU-hour" in heading and "$23.20/hour a backend" in heading, heading
    headers = new_page.locator("table.backends").first.locator("th").all_inner_texts()
    assert "$/M TOKENS (1H)" in [h.upper() for h in headers] and "BREAKER" in [h.upper() for h in headers]


def test_drain_asks_for_confirmation_first(gateway: str, new_page: Any) -> None:
    login(new_page, gateway)
    row = new_page.locator("table.backends tr", has=new_page.locator(".name", has_text="h100-1"))
    asked: list[str] = []

    def dismiss(dialog: Any) -> None:
        asked.append(dialog.message)
        dialog.dismiss()

    new_page.once("dialog", dismiss)
    row.locator("button.drain").click()
    new_page.wait_for_timeout(300)
    assert asked and "Drain h100-1?" in asked[0]
    with _admin(gateway) as admin:
        state = {r["name"]: r for r in admin.get("/admin/v1/backends").json()["data"]}
    assert not state["h100-1"]["draining"], "a dismissed confirmation drained the backend"
    new_page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.drain").click()
    row.locator("button.undrain").wait_for(timeout=5000)
    assert "h100-1" in new_page.locator("#fleet-alert").inner_text()
    row.locator("button.undrain").click()  # no confirmation to undo it
    row.locator("button.drain").wait_for(timeout=5000)


@pytest.mark.parametrize("width", [800, 1280])
def test_fleet_tables_line_up_and_fit(gateway: str, browser: Any, width: int, screenshots: Path) -> None:
    context = browser.new_context(viewport={"width": width, "height": 900})
    page = context.new_page()
    try:
        login(page, gateway)
        tables = page.locator("table.backends")
        assert tables.count() == 2
        where = "ths => ths.map(th => Math.round(th.getBoundingClientRect().left))"
        lefts = [t.locator("th").evaluate_all(where) for t in tables.all()]
        assert lefts[0] == lefts[1], f"the pools' columns do not line up: {lefts}"
        for section in page.locator("section.pool").all():
            overflow = section.evaluate("s => s.scrollWidth - s.clientWidth")
            assert overflow <= 1, f"a column is cut off at {width} px ({overflow} px hidden)"
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        save_screenshot(page, screenshots, f"fleet-{width}px")
    finally:
        context.close()


def test_explain_error_is_shown_beside_the_form(gateway: str, new_page: Any) -> None:
    login(new_page, gateway)
    new_page.goto(gateway + "/console/routing")
    new_page.fill("#explain textarea", '{"model": "echo-model", "messages": [')
    new_page.click("#explain button[type=submit]")
    problem = new_page.locator("#explain-error")
    problem.wait_for(state="visible")
    assert "Not explained" in problem.inner_text()
    form = new_page.locator("#explain").bounding_box()
    box = problem.bounding_box()
    assert form is not None and box is not None
    assert form["y"] <= box["y"] <= form["y"] + form["height"], "the error is not beside the form"
    assert new_page.locator("#flash").count() == 0, "the error went to the banner at the top"
    hello = '"messages": [{"role": "user", "content": "hi"}]'
    new_page.fill("#explain textarea", '{"model": "no-such-model", ' + hello + "}")
    new_page.click("#explain button[type=submit]")
    new_page.wait_for_function(
        "() => document.getElementById('explain-error').innerText.includes('no-such-model')"
    )
    new_page.fill(
        "#explain textarea", '{"model": "echo-model", "messages": [{"role": "user", "content": "hi"}]}'
    )
    new_page.click("#explain button[type=submit]")
    new_page.locator("#explain-result table.facts").wait_for()
    assert problem.is_hidden(), "an old error stays after a request that explains"


def _create_key(page: Any, name: str, **fields: str) -> str:
    page.fill("#create-key input[name=name]", name)
    for field, value in fields.items():
        page.fill(f"#create-key input[name={field}]", value)
    page.click("#create-key button[type=submit]")
    shown = page.locator("#new-key-value")
    shown.wait_for(state="visible")
    page.locator("table.keys tr", has_text=name).wait_for()
    return shown.inner_text()


def test_new_key_copied_is_cleared_and_revoked_is_cleared(gateway: str, browser: Any) -> None:
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    context.grant_permissions(["clipboard-read", "clipboard-write"], origin=gateway)
    page = context.new_page()
    try:
        login(page, gateway)
        page.goto(gateway + "/console/keys")
        material = _create_key(page, f"copy-{uuid.uuid4().hex[:6]}")
        page.click("#copy-key")
        page.locator("#new-key").wait_for(state="hidden")
        assert page.evaluate("navigator.clipboard.readText()") == material
        assert material not in page.content(), "the copied key is still on the page"
        name = f"revoke-{uuid.uuid4().hex[:6]}"
        material = _create_key(page, name)
        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("table.keys tr", has_text=name).locator("button.revoke").click()
        page.locator("#new-key").wait_for(state="hidden")
        assert material not in page.content(), "the revoked key is still on the page"
    finally:
        context.close()


def test_keys_search_filter_team_default_and_zero_budget(
    gateway: str, new_page: Any, screenshots: Path
) -> None:
    with _admin(gateway) as admin:
        api_made = admin.post("/admin/v1/keys", json={"name": f"api-{uuid.uuid4().hex[:6]}"}).json()
        zero = admin.post(
            "/admin/v1/keys", json={"name": f"zero-{uuid.uuid4().hex[:6]}", "budget_usd": 0}
        ).json()
    login(new_page, gateway)
    new_page.goto(gateway + "/console/keys")
    console_made = f"form-{uuid.uuid4().hex[:6]}"
    _create_key(new_page, console_made)
    with _admin(gateway) as admin:
        keys = {k["name"]: k for k in admin.get("/admin/v1/keys").json()["data"]}
    assert keys[console_made].get("team") == keys[api_made["name"]].get("team"), "team defaults differ"
    placeholder = new_page.locator("#create-key input[name=models]")
    fits = placeholder.evaluate(
        "i => { const c = document.createElement('canvas').getContext('2d'); const s = getComputedStyle(i);"
        " c.font = s.font; return c.measureText(i.placeholder).width <= i.clientWidth; }"
    )
    assert fits, "the models placeholder is cut off"
    zero_row = new_page.locator("table.keys tr", has_text=zero["name"])
    assert "budget $0" in zero_row.inner_text() and "of $0" not in zero_row.inner_text()
    rows = new_page.locator("table.keys tbody tr")
    total = rows.count()
    new_page.fill("#key-search", console_made)
    assert new_page.locator("table.keys tbody tr:not([hidden])").count() == 1
    assert f"1 of {total} keys" in new_page.locator("#key-count").inner_text()
    new_page.fill("#key-search", "")
    new_page.select_option("#key-filter", "budget")
    visible = new_page.locator("table.keys tbody tr:not([hidden])").all_inner_texts()
    assert any(zero["name"] in v for v in visible) and not any(console_made in v for v in visible)
    # The filter holds across the table's refresh.
    new_page.evaluate("document.getElementById('keys').dispatchEvent(new Event('refreshed'))")
    assert new_page.locator("table.keys tbody tr:not([hidden])").count() == len(visible)
    save_screenshot(new_page, screenshots, "keys-filtered")


def test_keys_show_spend_without_a_budget_and_last_used(gateway: str, new_page: Any) -> None:
    with _admin(gateway) as admin:
        used = admin.post("/admin/v1/keys", json={"name": f"used-{uuid.uuid4().hex[:6]}"}).json()
        idle = admin.post("/admin/v1/keys", json={"name": f"idle-{uuid.uuid4().hex[:6]}"}).json()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"authorization": f"Bearer {used['key']}"}
    answer = httpx.post(gateway + "/v1/chat/completions", json=body, headers=headers, trust_env=False)
    assert answer.status_code == 200, answer.text
    login(new_page, gateway)
    new_page.goto(gateway + "/console/keys")
    headers_shown = [h.upper() for h in new_page.locator("table.keys th").all_inner_texts()]
    column = headers_shown.index("LAST USED")
    used_row = new_page.locator("table.keys tbody tr", has_text=used["name"]).locator("td").all_inner_texts()
    idle_row = new_page.locator("table.keys tbody tr", has_text=idle["name"]).locator("td").all_inner_texts()
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d", used_row[column]), used_row
    assert idle_row[column] == "never"
    spend = headers_shown.index("SPEND")
    assert "this month, no budget" in used_row[spend], used_row
    new_page.select_option("#key-filter", "unused")
    visible = new_page.locator("table.keys tbody tr:not([hidden])").all_inner_texts()
    assert any(idle["name"] in v for v in visible) and not any(used["name"] in v for v in visible)


def test_explain_links_the_matching_rule_to_the_rule_shown(gateway: str, new_page: Any) -> None:
    login(new_page, gateway)
    new_page.goto(gateway + "/console/routing")
    rules = new_page.locator("table.rules tbody tr")
    assert rules.count() == 2 and "batch" in new_page.locator("#rule-2").inner_text()
    body = '{"model": "echo-model", "n": 2, "messages": [{"role": "user", "content": "hi"}]}'
    new_page.fill("#explain textarea", body)
    new_page.click("#explain button[type=submit]")
    link = new_page.locator("#explain-result a.rule-link")
    link.wait_for()
    assert link.inner_text() == "rule 2"
    link.click()
    assert new_page.url.endswith("#rule-2")
    assert new_page.evaluate("document.querySelector(':target').id") == "rule-2"
