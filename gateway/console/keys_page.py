"""The Keys page: every key with its limits, spend and last use, a search and a filter, a create form (the
key is shown once, with a copy button, and cleared once copied or revoked), revoke."""

from __future__ import annotations

import time
from html import escape
from typing import Any

from gateway.console.pages import e, money

FILTERS = (("all", "All keys"), ("active", "Active"), ("revoked", "Revoked"), ("budget", "With a budget"),
           ("near", "Budget 80% used or more"), ("unused", "Never used"))  # fmt: skip


def _limits(k: dict[str, Any]) -> str:
    parts = [f"{name} {k[name]:,}" for name in ("rpm", "tpm", "max_parallel") if k.get(name) is not None]
    return e(" · ".join(parts) or "unlimited")


def _spend(k: dict[str, Any]) -> str:
    """Settled spend in the key's period, what is held for its requests in flight, and its budget."""
    budget = k.get("budget_usd")
    spent = k.get("spent_usd", 0.0)
    held = k.get("held_usd")
    settled = spent if held is None else max(0.0, spent - held)
    period = e(k.get("budget_period", "month"))
    held_note = f" <small>+ {money(held)} held</small>" if held else ""
    if budget is None:
        return f"{money(settled)}{held_note} <small>this {period}, no budget</small>"
    if budget <= 0:
        return '<span class="state failing">budget $0: refused</span>'
    return (
        f'<meter min="0" max="{budget}" value="{min(settled, budget)}" high="{budget * 0.8}"></meter> '
        f"{money(settled)} of {money(budget)}{held_note} <small>per {period}</small>"
    )


def _last_used(k: dict[str, Any], now: float) -> str:
    at = k.get("last_used_at")
    if not at:
        return '<span class="muted">never</span>'
    return e(time.strftime("%Y-%m-%d %H:%M", time.localtime(at)))


def _tags(k: dict[str, Any]) -> str:
    """Words the filter matches (console.js): the key's state, budget and use."""
    tags = ["revoked" if k.get("revoked") else "active"]
    budget = k.get("budget_usd")
    if budget is not None:
        tags.append("budget")
        held = k.get("held_usd") or 0.0
        if budget <= 0 or (k.get("spent_usd", 0.0) - held) >= 0.8 * budget:
            tags.append("near")
    if not k.get("last_used_at"):
        tags.append("unused")
    return " ".join(tags)


def keys_fragment(keys: list[dict[str, Any]], enabled: bool, now: float | None = None) -> str:
    if not enabled:
        return "<p>Keys need the tenants service (an admin key or `auth.mode: keys`).</p>"
    now = time.time() if now is None else now
    rows = []
    for k in sorted(keys, key=lambda k: k.get("created_at", 0), reverse=True):
        revoked = k.get("revoked", False)
        action = (
            '<span class="state failing">revoked</span>'
            if revoked
            else f'<button type="button" class="revoke" data-action="/console/keys/{e(k["id"])}/revoke" '
            f'data-confirm="Revoke key {e(k.get("name") or k["id"])}? It stops working at once." '
            f'data-key-id="{e(k["id"])}" data-refresh-after="keys">Revoke</button>'
        )
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.get("created_at", 0)))
        cells = [
            f"<code>{e(k['id'])}</code>",
            e(k.get("name")),
            e(k.get("team") or "-"),
            e(", ".join(k.get("scopes") or []) or "-"),
            e(", ".join(k.get("models") or []) or "any"),
            _limits(k),
            _spend(k),
            _last_used(k, now),
            e(created),
            action,
        ]
        rows.append(f'<tr data-tags="{_tags(k)}">' + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    if not rows:
        return "<p>No keys yet.</p>"
    headers = ("Id", "Name", "Team", "Scopes", "Models", "Limits", "Spend", "Last used", "Created", "")
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    return f'<table class="keys"><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody></table>'


def keys_page(fragment: str, enabled: bool) -> str:
    form = (
        '<section><h2>Create a key</h2><form id="create-key" class="create-key">'
        '<label>Name <input name="name" required maxlength="64"></label>'
        '<label>Team <input name="team" placeholder="none" pattern="[A-Za-z0-9._:@\\-]{1,64}"></label>'
        '<label class="wide">Models <input name="models" placeholder="any; or a, b"></label>'
        '<label>RPM <input name="rpm" type="number" min="1"></label>'
        '<label>TPM <input name="tpm" type="number" min="1"></label>'
        '<label>Parallel <input name="max_parallel" type="number" min="1"></label>'
        '<label>Budget USD <input name="budget_usd" type="number" min="0" step="0.01"></label>'
        '<label>Period <select name="budget_period"><option>month</option><option>week</option>'
        "<option>day</option><option>total</option></select></label>"
        '<button type="submit">Create</button></form>'
        '<div id="new-key" hidden><p>The new key <code id="new-key-id"></code>, shown <b>once</b>: copy '
        "it now. It is cleared from this page once copied, or if it is revoked.</p>"
        '<output id="new-key-value"></output> <button type="button" id="copy-key">Copy</button> '
        '<button type="button" id="hide-key">Hide</button></div></section>'
        if enabled
        else ""
    )
    options = "".join(f'<option value="{v}">{e(label)}</option>' for v, label in FILTERS)
    tools = (
        '<div class="key-tools"><label>Search <input type="search" id="key-search" '
        'placeholder="id, name, team, model"></label>'
        f'<label>Show <select id="key-filter">{options}</select></label>'
        '<span id="key-count" class="muted"></span></div>'
        if enabled
        else ""
    )
    return (
        f'{form}<section><h2>Keys</h2>{tools}<div id="keys" data-fragment="/console/keys/fragment">'
        f"{fragment}</div></section>"
    )
