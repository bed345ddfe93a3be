"""deploy/grafana's dashboard reads only what `/metrics` exports: every metric a panel or variable queries,
with the labels it filters or groups on (a renamed metric would leave a panel silently empty). Checked
against a gateway in `keys` mode on Redis, which exports every series an `open` one does and the tenants'."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import ROOT, clean_redis, running_gateway, two_pool_fleet

DASHBOARD = ROOT / "deploy" / "grafana" / "switchyard-dashboard.json"
MODEL = "llama-3.1-8b"
FLEET = two_pool_fleet(MODEL, tpot_ms=1)
ADMIN_KEY = "sy-test-admin-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, set[str]]]:
    """Metric names `/metrics` has after some traffic (served, streamed, unknown model, rate-limited),
    each with the labels its series carry; a histogram's or summary's under its family name too."""
    prefix = f"itest-dash-{uuid.uuid4().hex[:10]}"
    try:
        with Fleet(parse_fleet_spec(FLEET, "<dashboard>"), log_dir=tmp_path_factory.mktemp("fleet")) as fleet:
            config: dict[str, Any] = fleet.gateway_config(health={"interval": 0.5, "timeout": 0.5})
            config["ledger"] = {"redis_url": "redis://127.0.0.1:6379/0", "key_prefix": prefix}
            config["auth"] = {"mode": "keys"}
            workdir = tmp_path_factory.mktemp("gateway")
            with running_gateway(config, workdir, {"SWITCHYARD_ADMIN_KEY": ADMIN_KEY}) as base:
                yield _traffic_then_metrics(base)
    finally:
        clean_redis(prefix)


def _traffic_then_metrics(base: str) -> dict[str, set[str]]:
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    created = httpx.post(base + "/admin/v1/keys", json={"name": "dash", "rpm": 2}, headers=admin, timeout=10)
    assert created.status_code == 201, created.text
    auth = {"authorization": f"Bearer {created.json()['key']}"}
    statuses = [
        _chat(base, auth, MODEL, False),
        _chat(base, auth, MODEL, True),
        _chat(base, auth, "nope", False),
    ]
    assert statuses == [200, 200, 404], statuses
    # A refusal (the key's rpm spent; a window that rolled over meanwhile gives it a few more tries).
    assert any(_chat(base, auth, MODEL, False) == 429 for _ in range(6))
    exported: dict[str, set[str]] = {}
    for line in httpx.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("# TYPE "):
            exported.setdefault(line.split()[2], set())
        elif line and not line.startswith("#"):
            name, _, labels = line.rpartition(" ")[0].partition("{")
            exported.setdefault(name, set()).update(re.findall(r'(\w+)="', labels))
    for suffix in ("_bucket", "_sum", "_count"):
        for name in [n for n in exported if n.endswith(suffix)]:
            exported.setdefault(name.removesuffix(suffix), set()).update(exported[name] - {"le"})
    return exported


def _chat(base: str, headers: dict[str, str], model: str, stream: bool) -> int:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 8,
        "stream": stream,
    }
    return httpx.post(base + "/v1/chat/completions", json=body, headers=headers, timeout=10).status_code


def _queries(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        if node.get("type") == "datasource":  # the variable choosing the Prometheus data source
            return
        for key, value in node.items():
            if key in ("expr", "query") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for value in node:
            yield from _queries(value)


def test_the_dashboard_queries_only_series_and_labels_the_gateway_exports(
    exported: dict[str, set[str]],
) -> None:
    queries = list(_queries(json.loads(DASHBOARD.read_text())))
    assert len(queries) >= 20
    for query in queries:
        names = re.findall(r"\b(switchyard_\w+)", query)
        assert names, query
        for name in names:
            assert name in exported, f"the dashboard reads {name}, which /metrics does not have: {query}"
        labels = set(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)\s*\"", query))
        for group in re.findall(r"\bby \(([^)]*)\)", query):
            labels.update(label.strip() for label in group.split(",") if label.strip() != "le")
        if query.startswith("label_values("):
            labels.add(query.removesuffix(")").split(",")[1].strip())
        for label in labels:
            assert any(label in exported[name] for name in names), (
                f"no series of {names} has `{label}`: {query}"
            )


def test_the_dashboard_shows_the_tenants_admissions_and_their_round_trips() -> None:
    queries = " ".join(_queries(json.loads(DASHBOARD.read_text())))
    for name in (
        "switchyard_tenant_admissions_total",
        "switchyard_tenant_admission_seconds_sum",
        "switchyard_tenant_admission_requests_total",
    ):
        assert name in queries, name
