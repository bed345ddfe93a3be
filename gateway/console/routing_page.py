"""The Routing page: the policy in force, the recent mix of classes, routes and vendors, and explain."""

from __future__ import annotations

import json
from typing import Any

from gateway.console.charts import line_chart, time_labels
from gateway.console.pages import e, table

SAMPLE_REQUEST = {
    "model": "llama-3.1-8b",
    "messages": [{"role": "user", "content": "Summarise the fleet's state in one line."}],
    "max_tokens": 64,
}


def _policy(state: dict[str, Any]) -> str:
    error = state.get("last_reload_error")
    rows = [
        ("Policy", e(state.get("name"))),
        ("Version", f"<code>{e(state.get('version') or '-')}</code>"),
        ("Source", e(state.get("source") or "-")),
        ("Classes", e(", ".join(state.get("classes") or []) or "-")),
        ("Decisions", e(state.get("decisions", "-"))),
        ("Mean decision", f"{state['mean_decision_us']} µs" if state.get("mean_decision_us") else "-"),
        ("Reloads applied", e(state.get("reloads", "not watched"))),
        ("Reloads rejected", e(state.get("rejected_reloads", "-"))),
        (
            "Last reload",
            f'<span class="error">{e(error)}</span>' if error else '<span class="state healthy">ok</span>',
        ),
    ]
    warnings = "".join(f'<li class="warning">{e(w)}</li>' for w in state.get("warnings") or [])
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table class="facts">{body}</table>' + (f"<ul>{warnings}</ul>" if warnings else "")


def _rules(state: dict[str, Any]) -> str:
    """The class rules in the order they are tried, each with an anchor (`#rule-N`) explain links to."""
    rules = state.get("rules") or []
    if not rules:
        return ""
    rows = "".join(
        f'<tr id="rule-{r["n"]}"><td>rule {r["n"]}</td><td>{e(r["class"])}</td>'
        f"<td><code>{e(json.dumps(r['when'], separators=(', ', ': ')))}</code></td>"
        f"<td>{e(r.get('description') or '')}</td></tr>"
        for r in rules
    )
    head = "<thead><tr><th>Rule</th><th>Class</th><th>When</th><th>Description</th></tr></thead>"
    title = "<h3>Class rules <small>tried in order</small></h3>"
    return f'{title}<table class="rules">{head}<tbody>{rows}</tbody></table>'


def _matched_by(matched: str) -> str:
    """`rule N` as a link to the rule in the policy section; `header` and `default` as they are."""
    if matched.startswith("rule ") and matched[5:].isdigit():
        return f'<a href="#rule-{matched[5:]}" class="rule-link">{e(matched)}</a>'
    return e(matched)


def _shares(counts: list[tuple[str, int]], total: int) -> str:
    rows = [
        [e(name), str(n), f'<meter min="0" max="{total}" value="{n}"></meter> {n / total * 100:.0f}%']
        for name, n in counts
    ]
    return table(("Name", "Requests", "Share"), rows, "mix") if rows else "<p>No requests yet.</p>"


def routing_page(state: dict[str, Any], mix: dict[str, Any], paths: list[str]) -> str:
    total = max(mix["count"], 1)
    minutes = len(next(iter(mix["split"].values()), []))
    labels = time_labels([mix["start"] + i * 60 for i in range(minutes or 30)], 60)
    chart = (
        line_chart("Requests per minute by vendor", labels, mix["split"], "", ".0f", partial_last=True)
        if mix["split"]
        else "<p>No requests in the last 30 minutes.</p>"
    )
    options = "".join(f'<option value="{e(p)}">{e(p)}</option>' for p in paths)
    sample = e(json.dumps(SAMPLE_REQUEST, indent=2))
    return (
        f"<section><h2>Policy in force</h2>{_policy(state)}{_rules(state)}</section>"
        f'<section class="split"><div><h2>Classes <small>last {mix["count"]} requests</small></h2>'
        f"{_shares(mix['classes'], total)}</div>"
        f"<div><h2>Routes</h2>{_shares(mix['routes'], total)}</div></section>"
        f"<section><h2>Vendor split <small>last 30 minutes</small></h2>{chart}</section>"
        '<section><h2>Explain a request</h2><form id="explain" class="explain">'
        f'<label>Endpoint <select name="endpoint">{options}</select></label>'
        f'<label>Request body (JSON)<textarea name="body" rows="9" spellcheck="false">{sample}</textarea>'
        '</label><div class="submit"><button type="submit">Explain</button>'
        '<p id="explain-error" class="error" role="alert" hidden></p></div></form>'
        '<div id="explain-result"></div></section>'
    )


def explained_fragment(result: dict[str, Any]) -> str:
    """`POST /admin/v1/explain`'s answer as HTML: class, route, candidates with scores, the pick."""
    detail = result.get("explanation") or {}
    pick = detail.get("choice") or (result["order"][0] if result.get("order") else None)
    facts = [
        ("Class", e(result.get("request_class"))),
        ("Matched by", _matched_by(detail.get("matched_by", "-"))),
        ("Route", e(result.get("route"))),
        ("Pick", f'<b class="pick">{e(pick or "none")}</b>'),
        ("Order", e(" → ".join(result.get("order") or []) or "-")),
    ]
    if result.get("why_none"):
        facts.append(("Why none", f'<span class="error">{e(result["why_none"])}</span>'))
    if detail.get("decision_us") is not None:
        facts.append(("Decided in", f"{detail['decision_us']} µs"))
    html = (
        "<table class=facts>" + "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in facts) + "</table>"
    )
    candidates = detail.get("candidates") or []
    if candidates:
        scorers = sorted({name for c in candidates for name in c["scores"]})
        rows = [
            [
                f'<b class="pick">{e(c["backend"])}</b>' if c["backend"] == pick else e(c["backend"]),
                e(c["vendor"]),
                e(c["tier"]),
                *(f"{c['scores'].get(s, 0):.3f}" for s in scorers),
                f"<b>{c['total']:.3f}</b>",
                f"{c['predicted_ttft_ms']:.0f} ms",
                e(c.get("why_not") or ""),
            ]
            for c in candidates
        ]
        headers = ["Candidate", "Vendor", "Tier", *scorers, "Total", "Predicted TTFT", "Note"]
        html += "<h3>Candidates</h3>" + table(headers, rows, "candidates")
    dropped = detail.get("dropped") or []
    if dropped:
        html += "<h3>Dropped</h3>" + table(
            ("Backend", "Reason"), [[e(d["backend"]), e(d["reason"])] for d in dropped], "dropped"
        )
    return html
