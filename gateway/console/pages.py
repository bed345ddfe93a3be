"""The console's HTML: the page frame, the login form, and each page's body, from plain data.

Everything shown passes through `escape`; there is no inline script or style (see the CSP in routes.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from gateway.console.charts import line_chart
from gateway.console.data import WINDOWS

PAGES = (("fleet", "Fleet"), ("costs", "Costs"), ("routing", "Routing"), ("keys", "Keys"))


def e(value: object) -> str:
    return escape("" if value is None else str(value))


def money(value: float | None) -> str:
    return "-" if value is None else f"${value:,.4f}" if abs(value) < 1 else f"${value:,.2f}"


def num(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None else format(value, spec)


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """Cells are HTML already (escape what is data)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def frame(title: str, current: str, csrf: str, body: str) -> str:
    nav = "".join(
        f'<a href="/console/{slug}"{" aria-current=page" if slug == current else ""}>{name}</a>'
        for slug, name in PAGES
    )
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">'
        f'<meta name="csrf-token" content="{e(csrf)}"><title>Switchyard · {e(title)}</title>'
        '<link rel="stylesheet" href="/console/static/console.css">'
        '<script src="/console/static/console.js" defer></script></head><body>'
        f'<header><strong class="brand">Switchyard</strong><nav>{nav}</nav>'
        '<form method="post" action="/console/logout" class="logout">'
        f'<input type="hidden" name="csrf" value="{e(csrf)}"><button type="submit">Log out</button></form>'
        f'</header><main id="page-{e(current)}"><h1>{e(title)}</h1>{body}</main></body></html>'
    )


def login(message: str = "", enabled: bool = True) -> str:
    form = (
        '<form method="post" action="/console/login" class="login">'
        '<label>Admin key <input type="password" name="admin_key" autocomplete="off" required autofocus>'
        '</label><button type="submit">Log in</button></form>'
        if enabled
        else ""
    )
    note = f'<p class="error" role="alert">{e(message)}</p>' if message else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Switchyard · Log in</title>'
        '<link rel="icon" href="data:,">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="stylesheet" href="/console/static/console.css"></head><body class="login-page">'
        f"<main><h1>Switchyard console</h1>{note}{form}</main></body></html>"
    )


# --- Fleet ----------------------------------------------------------------------------------------------


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def fleet_fragment(view: dict[str, Any], extra: dict[str, dict[str, Any]]) -> str:
    """The part of the Fleet page that refreshes itself. `extra`: per backend, accelerator and TTFT/TPOT."""
    fleet = view.get("fleet", {})
    shared = fleet.get("backends", {})
    replicas = fleet.get("replicas", [])
    summary = (
        f'<p class="summary">Fleet sync: <b>{e(fleet.get("sync", "off"))}</b>'
        + (f" · this replica {e(fleet.get('replica'))}" if fleet.get("replica") else "")
        + f" · replicas seen: <b>{len(replicas)}</b> · updated {time.strftime('%H:%M:%S')}</p>"
    )
    pools: dict[str, list[dict[str, Any]]] = {}
    for row in view.get("data", []):
        pools.setdefault(row["pool"], []).append(row)
    sections = [summary]
    for pool, rows in pools.items():
        first = extra.get(rows[0]["name"], {})
        up = sum(r["routable"] for r in rows)
        sections.append(
            f'<section class="pool"><h2>{e(pool)} <small>{e(rows[0]["vendor"])} · '
            f"{e(first.get('accelerator'))} · {up}/{len(rows)} routable</small></h2>"
        )
        body = []
        for r in rows:
            info = extra.get(r["name"], {})
            load = r["load"]
            drained_on = shared.get(r["name"], {}).get("draining_on", [])
            health = "healthy" if r["healthy"] else "failing"
            action = "undrain" if r["draining"] else "drain"
            button = (
                f'<button type="button" data-action="/console/backends/{e(r["name"])}/{action}" '
                f'data-refresh-after="fleet" class="{action}">{action.capitalize()}</button>'
            )
            body.append(
                [
                    f'<span class="name">{e(r["name"])}</span>',
                    e(r["vendor"]),
                    e(info.get("accelerator")),
                    f'<span class="state {health}">{health}</span>',
                    f'<span class="state breaker-{e(r["breaker"])}">{e(r["breaker"])}</span>',
                    f'<span class="state {"draining" if r["draining"] else "serving"}">'
                    f"{'draining' if r['draining'] else 'no'}</span>"
                    + (f" <small>({len(drained_on)} replicas)</small>" if drained_on else ""),
                    num(load["running"]),
                    num(load["waiting"]),
                    f'<meter min="0" max="1" value="{load["kv_cache_usage"]:.3f}"></meter> '
                    f"{load['kv_cache_usage'] * 100:.0f}%",
                    str(r["inflight"]),
                    _ms(info.get("ttft")),
                    _ms(info.get("tpot")),
                    button,
                ]
            )
        headers = ("Backend", "Vendor", "Accelerator", "Health", "Breaker", "Draining", "Running",
                   "Waiting", "KV cache", "In flight", "TTFT", "Time/token", "")  # fmt: skip
        sections.append(table(headers, body, "backends") + "</section>")
    return "".join(sections)


def fleet_page(fragment: str) -> str:
    return (
        '<div id="fleet" data-fragment="/console/fleet/fragment" data-every="3000" aria-live="polite">'
        f'{fragment}</div><p class="hint">Refreshes every 3 s. Drain: no new requests to the backend on '
        "any replica; requests in flight finish.</p>"
    )


# --- Costs ----------------------------------------------------------------------------------------------


def _cost_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for r in rows:
        allocated = r.get("allocated_usd", r.get("attributed_usd"))
        out.append(
            [
                e(r["name"]),
                num(r.get("requests")),
                num(r.get("prompt_tokens")),
                num(r.get("completion_tokens")),
                money(r.get("paid_usd")),
                money(allocated),
                money(r.get("idle_usd")),
                money(r.get("spend_usd")),
                money(r.get("blended_usd_per_mtok")),
                "-" if r.get("utilisation") is None else f"{r['utilisation'] * 100:.1f}%",
            ]
        )
    return out


COST_HEADERS = ("Name", "Requests", "Tokens in", "Tokens out", "Paid", "Allocated", "Idle", "Spend",
                "$/M tokens", "Utilisation")  # fmt: skip


def costs_page(window: str, tables: dict[str, list[dict[str, Any]]], chart: str, budgets: str) -> str:
    tabs = "".join(
        f'<a href="/console/costs?window={w}"{" aria-current=true" if w == window else ""}>{w}</a>'
        for w in WINDOWS
    )
    parts = [f'<nav class="windows">Window: {tabs}</nav>']
    titles = {"backend": "By backend", "pool": "By pool", "vendor": "By vendor", "key": "Spend by key",
              "model": "Spend by model"}  # fmt: skip
    for by, rows in tables.items():
        parts.append(f"<section><h2>{titles[by]} <small>last {e(window)}</small></h2>")
        parts.append(table(COST_HEADERS, _cost_rows(rows), "costs") if rows else "<p>No data.</p>")
        parts.append("</section>")
    parts.insert(1, f"<section><h2>Last 24 hours</h2>{chart}</section>")
    parts.append(f"<section><h2>Budgets</h2>{budgets}</section>")
    return "".join(parts)


def hour_labels(hours: Sequence[int]) -> list[str]:
    return [time.strftime("%H:00", time.localtime(h)) for h in hours]


def cost_chart(hours: Sequence[int], series: dict[str, list[dict[str, Any] | None]]) -> str:
    spend = {
        name: [None if row is None else (row.get("paid_usd") or row.get("spend_usd") or 0.0) for row in rows]
        for name, rows in series.items()
    }
    per_mtok = {
        name: [None if row is None else row.get("blended_usd_per_mtok") for row in rows]
        for name, rows in series.items()
    }
    labels = hour_labels(hours)
    return line_chart("Spend per hour by vendor (USD)", labels, spend, "", ".2f") + line_chart(
        "Cost per million tokens by vendor (USD)", labels, per_mtok, "", ".2f"
    )


def budget_bars(keys: list[dict[str, Any]]) -> str:
    rows = []
    for k in keys:
        budget = k.get("budget_usd")
        if budget is None:
            continue
        spent = k.get("spent_usd", 0.0)
        rows.append(
            [
                e(k.get("name") or k["id"]),
                e(k.get("team")),
                f'<meter min="0" max="{budget}" value="{min(spent, budget)}" high="{budget * 0.8}"></meter>',
                f"{money(spent)} of {money(budget)} ({spent / budget * 100 if budget else 0:.0f}%)",
                e(k.get("budget_period", "month")),
            ]
        )
    if not rows:
        return "<p>No key has a budget.</p>"
    return table(("Key", "Team", "Used", "Spent", "Period"), rows, "budgets")
