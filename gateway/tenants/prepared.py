"""What admitting a key's requests needs that does not change from one request to the next, worked out
once a minute per key (gateway/tenants/admission.py): its scopes, their `limits.ADMIT` arguments, the
headers' plan, its budgets, the counters a settlement changes."""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.redis.script_client import bulk
from gateway.tenants.admit_batch import encode_scopes
from gateway.tenants.answers import HeaderPlan
from gateway.tenants.keys import KeyRecord, TeamRecord
from gateway.tenants.limits import PARALLEL_TTL_S, ScopeCounters, budget_period, nano

SettleNames = tuple[tuple[bytes, bytes, bytes, bytes], ...]
"""Per scope the Redis counters a settlement changes: the window's tokens, the parallel slots, the
budget period's spend (kept for every key, budget or not) and what of it is held by requests in flight;
each name as the script's argument (RESP, `bulk`), encoded once per key and window, not per batch."""


@dataclass(slots=True)
class Prepared:
    """What admitting a key's request needs that does not change per request: built once a minute (and
    at each UTC midnight, when budget periods start), not per request."""

    until: float
    scopes: list[ScopeCounters]
    scope_args: tuple[int, bytes, bytes]
    """The scopes' `limits.ADMIT` arguments, encoded (`encode_scopes`)."""
    budgeted: bool
    header_plan: HeaderPlan
    budget_nanos: tuple[int, ...]
    """Per scope its budget in nano-USD, -1 without one (for `BudgetWatch`)."""
    _names: dict[int, SettleNames] = field(default_factory=dict)

    def names_for(self, namespace: str, window: int) -> SettleNames:
        """The counters a settlement of a request admitted in `window` changes (kept per window)."""
        names = self._names.get(window)
        if names is None:
            if len(self._names) > 4:
                self._names.clear()
            names = self._names[window] = settle_names(self.scopes, namespace, window)
        return names


def prepare(key: KeyRecord, team: TeamRecord | None, now: float) -> Prepared:
    period, ttl = budget_period(key.budget_period, now)
    scopes = [ScopeCounters("k:" + key.id, key, period, ttl)]
    if team is not None:
        period, ttl = budget_period(team.budget_period, now)
        scopes.append(ScopeCounters("t:" + team.name, team, period, ttl))
    args = []
    budgets = []
    for s in scopes:
        lim = s.limits
        budget = -1 if lim.budget_usd is None else nano(lim.budget_usd)
        budgets.append(budget)
        args.append(
            f"{s.name}|{s.period}|{lim.rpm or 0}|{lim.tpm or 0}|{lim.max_parallel or 0}|{budget}"
            f"|{s.period_ttl_s}|{PARALLEL_TTL_S}"
        )
    # Every budget period starts at a UTC midnight: rebuild then (and at least once a minute).
    until = min(now + 60.0, (now // 86_400 + 1) * 86_400)
    budgeted = any(s.limits.budget_usd is not None for s in scopes)
    return Prepared(until, scopes, encode_scopes(args), budgeted, HeaderPlan.of(scopes), tuple(budgets))


def settle_names(scopes: list[ScopeCounters], namespace: str, window: int) -> SettleNames:
    return tuple(
        (
            bulk(f"{namespace}:tk:{s.name}:{window}"),
            bulk(f"{namespace}:pa:{s.name}"),
            bulk(f"{namespace}:sp:{s.name}:{s.period}"),
            bulk(f"{namespace}:hd:{s.name}:{s.period}"),
        )
        for s in scopes
    )
