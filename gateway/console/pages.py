"""The console's HTML: the page frame, the login form, and each page's body, from plain data.

Everything shown passes through `escape`; there is no inline script or style (see the CSP in routes.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from html import escape
from typing import Any

from gateway.console.charts import line_chart, time_labels
from gateway.console.data import WINDOWS
from gateway.ledger.costs import IDLE_ROW

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


# --- Fleet ---------------------------------------------------------------------------------------------

STALE_S = 5.0
"""Scraped figures older than this (a few scrapes at the default 1 s) are not shown as current."""


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _clock(wall: float | None, now: float) -> str:
    """`HH:MM:SS (3m ago)`."""
    if wall is None:
        return "-"
    ago = max(0.0, now - wall)
    span = f"{ago:.0f}s" if ago < 90 else f"{ago / 60:.0f}m" if ago < 5400 else f"{ago / 3600:.1f}h"
    return f"{time.strftime('%H:%M:%S', time.localtime(wall))} ({span} ago)"


def fleet_alert(view: dict[str, Any], now: float | None = None) -> str:
    """The fleet's trouble in one box at the top of every page: backends failing their health check,
    with an open or half-open breaker, paused or drained, each with its reason and since when."""
    now = time.time() if now is None else now
    rows = view.get("data", [])
    problems: list[tuple[str, str, str]] = []  # (kind, backend, detail)
    for r in rows:
        name = r["name"]
        if not r["healthy"]:
            problems.append(
                ("failing", name, f"health check failing since {_clock(r.get('health_failing_since'), now)}")
            )
        if r["breaker"] == "open":
            why = r.get("breaker_reason") or "request failures"
            problems.append(
                ("breaker open", name, f"{why}; opened {_clock(r.get('breaker_opened_at'), now)}")
            )
        elif r["breaker"] == "half-open":
            problems.append(("breaker half-open", name, f"probing after: {r.get('breaker_reason') or '-'}"))
        if r.get("paused_s"):
            problems.append(
                ("paused", name, f"asked for no traffic (Retry-After) for {r['paused_s']:.0f}s more")
            )
        if r["draining"]:
            problems.append(("draining", name, "drained by an operator"))
    routable = sum(1 for r in rows if r["routable"])
    if not problems:
        return (
            f'<p class="fleet-alert ok" id="fleet-alert" role="status">All {len(rows)} backends routable.</p>'
        )
    counts: dict[str, int] = {}
    for kind, _, _ in problems:
        counts[kind] = counts.get(kind, 0) + 1
    head = " · ".join(f"<b>{n}</b> {e(kind)}" for kind, n in counts.items())
    items = "".join(
        f'<li><span class="state {e(kind.split()[0])}">{e(kind)}</span> <b>{e(name)}</b> {e(detail)}</li>'
        for kind, name, detail in problems
    )
    bad = "bad" if any(k in ("failing", "breaker open") for k, _, _ in problems) else "warn"
    return (
        f'<section class="fleet-alert {bad}" id="fleet-alert" role="status"><p>{routable}/{len(rows)} '
        f'backends routable: {head} <a href="/console/fleet">Fleet</a></p><ul>{items}</ul></section>'
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _per_mtok(row: dict[str, Any] | None) -> str:
    """Blended $/M tokens and, beside it, what it would be at full utilisation."""
    if not row or row.get("blended_usd_per_mtok") is None:
        return "-"
    blended = row["blended_usd_per_mtok"]
    full = full_use_per_mtok(row)
    return money(blended) + (f" <small>{money(full)} at 100%</small>" if full is not None else "")


def full_use_per_mtok(row: dict[str, Any]) -> float | None:
    """$/M tokens if the GPUs paid for had been busy all the time: blended x utilisation."""
    blended, use = row.get("blended_usd_per_mtok"), row.get("utilisation")
    return None if blended is None or not use else blended * use


FLEET_HEADERS = ("Backend", "State", "Breaker", "Run / wait", "KV cache", "In flight", "TTFT",
                 "Per token", "$/M tokens (1h)", "")  # fmt: skip
FLEET_COLS = "".join(f'<col class="c{i}">' for i in range(len(FLEET_HEADERS)))


def _backend_row(r: dict[str, Any], info: dict[str, Any], cost: dict[str, Any] | None, replicas: int) -> str:
    load = r["load"]
    age = r.get("load_age_s")
    broken = not r["healthy"] or r["breaker"] == "open"
    stale = broken or age is None or age > STALE_S
    scraped = "never scraped" if age is None else f"last scraped {age:.0f}s ago"
    states = []
    if not r["healthy"]:
        states.append('<span class="state failing">failing</span>')
    if r["draining"]:
        states.append(
            '<span class="state draining">draining</span>'
            + (f" <small>({replicas} replicas)</small>" if replicas else "")
        )
    if not states:
        states.append('<span class="state healthy">healthy</span>')
    breaker = f'<span class="state breaker-{e(r["breaker"])}">{e(r["breaker"])}</span>'
    if r.get("breaker_opened"):
        why = e(r.get("breaker_reason") or "")
        breaker += f' <small class="opened" title="{why}">opened {r["breaker_opened"]}&times;</small>'
    if stale:
        run_wait = kv = f'<span class="stale" title="{e(scraped)}">stale</span>'
    else:
        run_wait = f"{num(load['running'])} / {num(load['waiting'])}"
        kv = (
            f'<meter min="0" max="1" value="{load["kv_cache_usage"]:.3f}"></meter> '
            f"{load['kv_cache_usage'] * 100:.0f}%"
        )
    latency = [_ms(info.get("ttft")), _ms(info.get("tpot"))]
    if broken:
        latency = [f'<span class="stale" title="measured before it failed">{v}</span>' for v in latency]
    action = "undrain" if r["draining"] else "drain"
    confirm = (
        f' data-confirm="Drain {e(r["name"])}? No replica sends it new requests until undrained; the '
        f'{r["inflight"]} in flight here finish."'
        if action == "drain"
        else ""
    )
    button = (
        f'<button type="button" data-action="/console/backends/{e(r["name"])}/{action}" '
        f'data-refresh-after="fleet" class="{action}"{confirm}>{action.capitalize()}</button>'
    )
    cells = [
        f'<span class="name">{e(r["name"])}</span>',
        " ".join(states),
        breaker,
        run_wait,
        kv,
        str(r["inflight"]),
        *latency,
        _per_mtok(cost),
        button,
    ]
    cls = "failing" if broken else "draining" if r["draining"] else ""
    return f'<tr class="{cls}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"


def fleet_fragment(
    view: dict[str, Any],
    extra: dict[str, dict[str, Any]],
    costs: dict[str, dict[str, dict[str, Any]]] | None = None,
) -> str:
    """The part of the Fleet page that refreshes itself. `extra`: per backend, accelerator and TTFT/TPOT;
    `costs`: the last hour's cost rows by `backend` and by `pool` (None while being read)."""
    costs = costs or {}
    fleet = view.get("fleet", {})
    shared = fleet.get("backends", {})
    replicas = fleet.get("replicas", [])
    summary = (
        f'<p class="summary">Fleet sync: <b>{e(fleet.get("sync", "off"))}</b>'
        + (f" · this replica {e(fleet.get('replica'))}" if fleet.get("replica") else "")
        + f" · replicas seen: <b>{len(replicas)}</b> · updated {time.strftime('%H:%M:%S')}"
        + ("" if costs else " · costs of the last hour: being read")
        + "</p>"
    )
    pools: dict[str, list[dict[str, Any]]] = {}
    for row in view.get("data", []):
        pools.setdefault(row["pool"], []).append(row)
    sections = [fleet_alert(view), summary]
    head = "".join(f"<th>{e(h)}</th>" for h in FLEET_HEADERS)
    for pool, rows in pools.items():
        first = rows[0]
        up = sum(r["routable"] for r in rows)
        price, gpus = first.get("price_per_gpu_hour"), first.get("gpus_per_backend") or 1
        pool_cost = costs.get("pool", {}).get(pool)
        facts = [e(first["vendor"]), e(first.get("accelerator"))]
        if price is not None:
            facts.append(f"{money(price)}/GPU-hour &times; {gpus} = {money(price * gpus)}/hour a backend")
        if pool_cost:
            facts.append(f"utilisation (1h) {_pct(pool_cost.get('utilisation'))}")
            facts.append(f"$/M tokens {_per_mtok(pool_cost)}")
        cls = "bad" if up < len(rows) else ""
        facts.append(f'<span class="routable {cls}">{up}/{len(rows)} routable</span>')
        body = "".join(
            _backend_row(
                r,
                extra.get(r["name"], {}),
                costs.get("backend", {}).get(r["name"]),
                len(shared.get(r["name"], {}).get("draining_on", [])),
            )
            for r in rows
        )
        sections.append(
            f'<section class="pool"><h2>{e(pool)} <small>{" · ".join(facts)}</small></h2>'
            f'<table class="backends"><colgroup>{FLEET_COLS}</colgroup><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></section>"
        )
    return "".join(sections)


def fleet_page(fragment: str) -> str:
    return (
        '<div id="fleet" data-fragment="/console/fleet/fragment" data-every="3000" aria-live="polite">'
        f'{fragment}</div><p class="hint">Refreshes every 3 s. Drain: no new requests to the backend on '
        "any replica; requests in flight finish. Load figures older than 5 s, and those of a failing "
        "backend, show as stale. $/M tokens: paid GPU time over tokens served; at 100%: if the GPUs had "
        "been busy all the time.</p>"
    )


# --- Costs ---------------------------------------------------------------------------------------------

GPU_ROWS = ("vendor", "pool", "backend")
"""Dimensions whose rows own GPUs: they are paid for. Key and model rows are allocated a share of that."""
GPU_HEADERS = ("Name", "Requests", "Tokens in", "Tokens out", "$/GPU-hour", "GPU-hours", "Utilisation",
               "Paid", "Allocated", "Idle", "$/M in", "$/M out", "$/M blended", "$/M at 100%")  # fmt: skip
USE_HEADERS = ("Name", "Requests", "Tokens in", "Tokens out", "Allocated", "$/M in", "$/M out",
               "$/M blended")  # fmt: skip
SPEND_NOTE = (
    '<p class="hint"><b>Paid</b>: GPU time bought (price per GPU-hour &times; GPU-hours), busy or idle. '
    "<b>Allocated</b>: the part of paid used by requests, shared among them by their tokens. "
    "<b>Idle</b>: paid and used by no request (paid = allocated + idle). Key and model rows own no GPU: "
    "they show what was allocated to them; the idle share is its own row, last. <b>$/M at 100%</b>: "
    "blended $/M tokens had the GPUs been busy all the time (blended &times; utilisation).</p>"
)


def _cost_rows(by: str, rows: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    ordered = sorted(rows, key=lambda r: r["name"] == IDLE_ROW)  # the idle row last
    for r in ordered:
        allocated = r.get("allocated_usd", r.get("attributed_usd"))
        common = [num(r.get("requests")), num(r.get("prompt_tokens")), num(r.get("completion_tokens"))]
        rates = [
            money(r.get("input_usd_per_mtok")),
            money(r.get("output_usd_per_mtok")),
            money(r.get("blended_usd_per_mtok")),
        ]
        if by in GPU_ROWS:
            price = r.get("price_per_gpu_hour")
            out.append(
                [
                    e(r["name"]),
                    *common,
                    money(price),
                    num(r.get("gpu_hours"), ",.2f"),
                    _pct(r.get("utilisation")),
                    money(r.get("paid_usd")),
                    money(allocated),
                    money(r.get("idle_usd")),
                    *rates,
                    money(full_use_per_mtok(r)),
                ]
            )
        elif r["name"] == IDLE_ROW:
            idle = f"idle {money(r.get('idle_usd'))}"
            out.append(["<i>idle: paid, used by no request</i>", "", "", "", idle, "", "", ""])
        else:
            out.append([e(r["name"]), *common, money(allocated), *rates])
    return out


def costs_page(window: str, tables: dict[str, list[dict[str, Any]]], chart: str) -> str:
    tabs = "".join(
        f'<a href="/console/costs?window={w}"{" aria-current=true" if w == window else ""}>{w}</a>'
        for w in WINDOWS
    )
    parts = [f'<nav class="windows">Window: {tabs}</nav>']
    titles = {"backend": "By backend", "pool": "By pool", "vendor": "By vendor",
              "key": "Allocated to keys", "model": "Allocated to models"}  # fmt: skip
    for by, rows in tables.items():
        headers = GPU_HEADERS if by in GPU_ROWS else USE_HEADERS
        parts.append(f'<section class="costs-{by}"><h2>{titles[by]} <small>last {e(window)}</small></h2>')
        parts.append(table(headers, _cost_rows(by, rows), f"costs by-{by}") if rows else "<p>No data.</p>")
        parts.append("</section>")
    parts.insert(1, f'<section class="charts"><h2>Over the window <small>{e(window)}</small></h2>{chart}'
                    f"{SPEND_NOTE}</section>")  # fmt: skip
    return "".join(parts)


def budgets_section(keys: list[dict[str, Any]]) -> str:
    """Read at each view (a counter per key), not with the cost tables: what is held changes by the second."""
    return f"<section><h2>Budgets <small>now</small></h2>{budget_bars(keys)}</section>"


def cost_chart(starts: Sequence[int], step: int, series: dict[str, list[dict[str, Any] | None]]) -> str:
    """Paid per step and blended $/M tokens by vendor; the last step, still filling, drawn as partial."""
    paid = {
        name: [None if row is None else (row.get("paid_usd") or 0.0) for row in rows]
        for name, rows in series.items()
    }
    per_mtok = {
        name: [None if row is None else row.get("blended_usd_per_mtok") for row in rows]
        for name, rows in series.items()
    }
    per = "hour" if step == 3600 else "minute" if step == 60 else f"{step // 60} minutes"
    labels = time_labels(starts, step)
    first = line_chart(f"Paid per {per} by vendor (USD)", labels, paid, "", ".2f", partial_last=True)
    title = f"Blended cost per million tokens by vendor, per {per} (USD)"
    return first + line_chart(title, labels, per_mtok, "", ".2f", partial_last=True)


def budget_bars(keys: list[dict[str, Any]]) -> str:
    rows = []
    for k in keys:
        budget = k.get("budget_usd")
        if budget is None:
            continue
        spent = k.get("spent_usd", 0.0)
        held = k.get("held_usd")
        settled = spent - held if held is not None else spent
        if budget <= 0:
            used = '<span class="state failing">budget $0: every request is refused</span>'
            bar = ""
        else:
            used = f"{money(settled)} of {money(budget)} ({settled / budget * 100:.0f}%)"
            if held:
                used += f" <small>+ {money(held)} held for requests in flight</small>"
            bar = (
                f'<meter min="0" max="{budget}" value="{min(settled, budget)}" high="{budget * 0.8}"></meter>'
            )
        rows.append(
            [e(k.get("name") or k["id"]), e(k.get("team")), bar, used, e(k.get("budget_period", "month"))]
        )
    if not rows:
        return "<p>No key has a budget.</p>"
    return table(("Key", "Team", "Used", "Charged to the budget", "Period"), rows, "budgets")
