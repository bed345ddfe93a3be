"""The Keys page: every key with its limits and budget, a create form (the key is shown once), revoke."""

from __future__ import annotations

import time
from typing import Any

from gateway.console.pages import e, money, table


def _limits(k: dict[str, Any]) -> str:
    parts = [f"{name} {k[name]:,}" for name in ("rpm", "tpm", "max_parallel") if k.get(name) is not None]
    return e(" · ".join(parts) or "unlimited")


def _budget(k: dict[str, Any]) -> str:
    budget = k.get("budget_usd")
    spent = k.get("spent_usd", 0.0)
    if budget is None:
        return f"{money(spent)} <small>no budget</small>"
    return (
        f'<meter min="0" max="{budget}" value="{min(spent, budget)}" high="{budget * 0.8}"></meter> '
        f"{money(spent)} of {money(budget)} <small>per {e(k.get('budget_period', 'month'))}</small>"
    )


def keys_fragment(keys: list[dict[str, Any]], enabled: bool) -> str:
    if not enabled:
        return "<p>Keys need the tenants service (an admin key or `auth.mode: keys`).</p>"
    rows = []
    for k in sorted(keys, key=lambda k: k.get("created_at", 0), reverse=True):
        revoked = k.get("revoked", False)
        action = (
            '<span class="state failing">revoked</span>'
            if revoked
            else f'<button type="button" class="revoke" data-action="/console/keys/{e(k["id"])}/revoke" '
            f'data-confirm="Revoke key {e(k.get("name") or k["id"])}? It stops working at once." '
            'data-refresh-after="keys">Revoke</button>'
        )
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(k.get("created_at", 0)))
        rows.append(
            [
                f"<code>{e(k['id'])}</code>",
                e(k.get("name")),
                e(k.get("team")),
                e(", ".join(k.get("scopes") or []) or "-"),
                e(", ".join(k.get("models") or []) or "any"),
                _limits(k),
                _budget(k),
                e(created),
                action,
            ]
        )
    headers = ("Id", "Name", "Team", "Scopes", "Models", "Limits", "Budget", "Created", "")
    return table(headers, rows, "keys") if rows else "<p>No keys yet.</p>"


def keys_page(fragment: str, enabled: bool) -> str:
    form = (
        '<section><h2>Create a key</h2><form id="create-key" class="create-key">'
        '<label>Name <input name="name" required maxlength="64"></label>'
        '<label>Team <input name="team" value="default" pattern="[A-Za-z0-9._:@\\-]{1,64}"></label>'
        '<label>Models <input name="models" placeholder="any (comma-separated)"></label>'
        '<label>RPM <input name="rpm" type="number" min="1"></label>'
        '<label>TPM <input name="tpm" type="number" min="1"></label>'
        '<label>Parallel <input name="max_parallel" type="number" min="1"></label>'
        '<label>Budget USD <input name="budget_usd" type="number" min="0" step="0.01"></label>'
        '<label>Period <select name="budget_period"><option>month</option><option>week</option>'
        "<option>day</option><option>total</option></select></label>"
        '<button type="submit">Create</button></form>'
        '<div id="new-key" hidden><p>The new key, shown <b>once</b>: copy it now.</p>'
        '<output id="new-key-value"></output></div></section>'
        if enabled
        else ""
    )
    return (
        f'{form}<section><h2>Keys</h2><div id="keys" data-fragment="/console/keys/fragment">'
        f"{fragment}</div></section>"
    )
