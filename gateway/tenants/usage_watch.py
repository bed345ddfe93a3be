"""Budget alerts: a log line and a metric when a key's or team's budget passes 80% and 100%, and the
admission counters /metrics shows (gateway/tenants/admission.py feeds it once per admission)."""

from __future__ import annotations

import logging

from gateway.tenants.limits import NANO, ScopeCounters, Verdict, nano

log = logging.getLogger("switchyard.tenants")

THRESHOLDS = (0.8, 1.0)


class BudgetWatch:
    def __init__(self) -> None:
        self.admitted = 0
        self.refused: dict[str, int] = {}
        self._spent: dict[str, tuple[int, int]] = {}
        """Per budgeted scope: (spent or reserved, budget), nano-USD, as of its last admission here."""
        self.crossed: dict[tuple[str, float], int] = {}
        self._alerted: set[tuple[str, str, float]] = set()

    @property
    def used(self) -> dict[str, float]:
        """Per budgeted scope: the share of its budget spent or reserved, as of the last admission."""
        return {
            name: min(spent / budget, 10.0) if budget > 0 else 1.0
            for name, (spent, budget) in self._spent.items()
        }

    def observe(
        self, scopes: list[ScopeCounters], verdict: Verdict, cost: int, budget_nanos: tuple[int, ...] = ()
    ) -> None:
        """`budget_nanos`: per scope its budget in nano-USD (-1: none), when the caller has it at hand."""
        admitted = verdict.admitted
        if admitted:
            self.admitted += 1
        else:
            self.refused[verdict.refused_by] = self.refused.get(verdict.refused_by, 0) + 1
        counts = verdict.counts
        for i, scope in enumerate(scopes):
            budget = (
                budget_nanos[i]
                if budget_nanos
                else -1
                if scope.limits.budget_usd is None
                else nano(scope.limits.budget_usd)
            )
            if budget < 0:
                continue
            if admitted:
                spent = counts[3 * i + 2]
            elif i == verdict.refused_scope:
                spent = counts[2] + (cost if verdict.refused_by == "budget" else 0)
            else:
                continue
            self._spent[scope.name] = (spent, budget)
            if spent * 5 < budget * 4:  # under the first threshold (80%)
                continue
            ratio = spent / budget if budget > 0 else 1.0
            for threshold in THRESHOLDS:
                mark = (scope.name, scope.period, threshold)
                if ratio >= threshold and mark not in self._alerted:
                    self._alerted.add(mark)
                    key = (scope.name, threshold)
                    self.crossed[key] = self.crossed.get(key, 0) + 1
                    log.warning(
                        "budget of %s for %s at %d%%: $%.6f of $%g spent or reserved",
                        scope.name,
                        scope.period,
                        int(threshold * 100),
                        spent / NANO,
                        budget / NANO,
                    )

    def render(self, scopes: bool = True) -> str:
        """The Prometheus series; `scopes`: also those of each budgeted key and team."""
        out = [
            "# HELP switchyard_tenant_admissions_total Requests admitted or refused by key and team limits.",
            "# TYPE switchyard_tenant_admissions_total counter",
            f'switchyard_tenant_admissions_total{{outcome="admitted"}} {self.admitted}',
        ]
        out += [
            f'switchyard_tenant_admissions_total{{outcome="refused",limit="{k}"}} {n}'
            for k, n in sorted(self.refused.items())
        ]
        if not scopes:
            return "\n".join(out) + "\n"
        out += [
            "# HELP switchyard_budget_used_ratio Share of a budget spent or reserved (k:<key id>, t:<team>).",
            "# TYPE switchyard_budget_used_ratio gauge",
        ]
        out += [f'switchyard_budget_used_ratio{{scope="{s}"}} {r:.6f}' for s, r in sorted(self.used.items())]
        out += [
            "# HELP switchyard_budget_threshold_total Times a budget passed 80% or 100% in this replica.",
            "# TYPE switchyard_budget_threshold_total counter",
        ]
        out += [
            f'switchyard_budget_threshold_total{{scope="{s}",threshold="{t:g}"}} {n}'
            for (s, t), n in sorted(self.crossed.items())
        ]
        return "\n".join(out) + "\n"
