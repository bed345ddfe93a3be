"""`/metrics` series that name keys and teams: on the admin port, or on the public one when configured."""

from __future__ import annotations

from gateway.admin.port import ON_ADMIN_PORT
from gateway.app import budget_series
from gateway.config.settings import AuthOptions, LedgerOptions
from gateway.ledger.factory import build_ledger
from gateway.tenants.admission import Tenants
from gateway.tenants.keys import KeyRecord
from gateway.tenants.limits import Verdict
from gateway.tenants.prepared import prepare
from gateway.tenants.store_memory import MemoryTenantStore


def _tenants(public_key_metrics: bool) -> Tenants:
    options = AuthOptions(mode="keys", public_key_metrics=public_key_metrics)
    tenants = Tenants(options, MemoryTenantStore(), build_ledger(LedgerOptions(store="memory"), []), "t")
    prepared = prepare(KeyRecord(id="key_budgeted", budget_usd=2.0), None, 0.0)
    verdict = Verdict(True, 0, "", 0.0, 0, [1, 1, 500_000_000] * len(prepared.scopes))
    tenants.watch.observe(prepared.scopes, verdict, 0, prepared.budget_nanos)
    return tenants


def test_per_key_series_only_on_the_admin_port_by_default() -> None:
    render = budget_series(_tenants(public_key_metrics=False))
    public, admin = render({"type": "http"}), render({"type": "http", ON_ADMIN_PORT: True})
    assert 'switchyard_budget_used_ratio{scope="k:key_budgeted"} 0.250000' in admin
    assert "key_budgeted" not in public and "switchyard_budget_used_ratio" not in public
    assert "switchyard_tenant_admissions_total" in public
    assert "switchyard_tenant_admission_seconds" not in public  # no Redis, no round trips to count


def test_public_key_metrics_shows_them_on_the_public_port_too() -> None:
    render = budget_series(_tenants(public_key_metrics=True))
    assert 'switchyard_budget_used_ratio{scope="k:key_budgeted"}' in render({"type": "http"})
