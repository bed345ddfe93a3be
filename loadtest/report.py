"""From outcomes to the report: per policy and class latency percentiles, SLO attainment, goodput,
errors, throughput, where requests went, and the fleet's cost per million tokens.

All times are simulated (the fleet's clock); rates are per simulated second of the arrival window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from backends.sim.fleet_spec import FleetSpec
from loadtest.client import Outcome
from loadtest.scenario import Scenario, Slo
from loadtest.stats import summary

SPLIT_BINS = 24


def met_slo(outcome: Outcome, slo: Slo) -> bool:
    """Answered without error and within every bound the class sets (seconds vs milliseconds)."""
    if not outcome.ok:
        return False
    checks = ((slo.ttft_ms, outcome.ttft), (slo.tpot_ms, outcome.tpot), (slo.e2e_ms, outcome.e2e))
    return all(limit is None or value is None or value * 1000 <= limit for limit, value in checks)


def _ms(values: Sequence[float | None]) -> list[float]:
    return [v * 1000 for v in values if v is not None]


def class_metrics(outcomes: Sequence[Outcome], slo_of: dict[str, Slo], duration_s: float) -> dict[str, Any]:
    ok = [o for o in outcomes if o.ok]
    met = sum(met_slo(o, slo_of[o.request_class]) for o in outcomes)
    total = len(outcomes)
    output_tokens = sum(o.completion_tokens for o in ok)
    return {
        "requests": total,
        "ok": len(ok),
        "errors": total - len(ok),
        "error_kinds": dict(Counter(o.error for o in outcomes if o.error is not None)),
        "slo_met": met,
        "slo_attainment": met / total if total else None,
        "goodput_rps": met / duration_s,
        "throughput_rps": len(ok) / duration_s,
        "output_tokens_per_s": output_tokens / duration_s,
        "prompt_tokens": sum(o.prompt_tokens for o in ok),
        "output_tokens": output_tokens,
        "ttft_ms": summary(_ms([o.ttft for o in ok])),
        "tpot_ms": summary(_ms([o.tpot for o in ok])),
        "e2e_ms": summary(_ms([o.e2e for o in ok])),
    }


def split(outcomes: Sequence[Outcome]) -> dict[str, dict[str, int]]:
    """Answered requests by vendor, pool and backend (from the gateway's response headers)."""
    return {
        dim: dict(sorted(Counter(getattr(o, dim) or "?" for o in outcomes if o.status).items()))
        for dim in ("vendor", "pool", "backend")
    }


def split_over_time(outcomes: Sequence[Outcome], duration_s: float, bins: int = SPLIT_BINS) -> dict[str, Any]:
    """Requests sent in each of `bins` equal slices of the arrival window, by vendor."""
    width = duration_s / bins
    vendors = sorted({o.vendor for o in outcomes if o.vendor})
    counts = [dict.fromkeys(vendors, 0) for _ in range(bins)]
    for o in outcomes:
        if o.vendor:
            counts[min(bins - 1, int(o.sent_at / width))][o.vendor] += 1
    return {"bin_s": width, "vendors": vendors, "bins": counts}


def paid_gpu_time(fleet: FleetSpec, wall_s: float) -> dict[str, dict[str, float]]:
    """What the run paid for, by vendor: every GPU of the fleet for the run's whole wall time.

    Taken from the run's own start and end, not from the ledger, whose paid time starts with the
    gateway (before the run) and ends at its last claim (up to a claim interval before the run's end).
    """
    paid: dict[str, dict[str, float]] = {}
    for g in fleet.groups:
        gpus = g.count * g.gpus_per_backend
        vendor = paid.setdefault(g.vendor, {"gpus": 0, "paid_gpu_s": 0.0, "spend_usd": 0.0})
        vendor["gpus"] += gpus
        vendor["paid_gpu_s"] += gpus * wall_s
        vendor["spend_usd"] += gpus * wall_s * g.price_per_gpu_hour / 3600.0
    return paid


def cost_summary(
    vendor_rows: Sequence[dict[str, Any]], time_scale: float, fleet: FleetSpec, wall_s: float
) -> dict[str, Any]:
    """Fleet spend over the run (real clock) over tokens served (from `/admin/v1/costs?by=vendor`).

    The fleet is paid by the real clock while the simulated GPUs did `time_scale` times as much work
    per real second; `usd_per_mtok` scales the spend back to the simulated GPUs' speed. The ledger's
    own figure is kept (`ledger_*`) to compare with.
    """
    paid = paid_gpu_time(fleet, wall_s)
    spend = sum(v["spend_usd"] for v in paid.values())
    ledger_spend = sum(float(r.get("spend_usd") or 0.0) for r in vendor_rows)
    tokens_of = {r["name"]: int(r["prompt_tokens"]) + int(r["completion_tokens"]) for r in vendor_rows}
    tokens = sum(tokens_of.values())
    rows = {r["name"]: r for r in vendor_rows}
    return {
        "wall_s": wall_s,
        "gpus": sum(v["gpus"] for v in paid.values()),
        "paid_gpu_s": sum(v["paid_gpu_s"] for v in paid.values()),
        "spend_usd": spend,
        "tokens": tokens,
        "usd_per_mtok": spend / tokens * 1e6 * time_scale if tokens else None,
        "spend_usd_ledger": ledger_spend,
        "ledger_usd_per_mtok": ledger_spend / tokens * 1e6 if tokens else None,
        "by_vendor": {
            name: {
                "requests": rows[name]["requests"] if name in rows else 0,
                "gpus": v["gpus"],
                "paid_gpu_s": v["paid_gpu_s"],
                "spend_usd": v["spend_usd"],
                "spend_usd_ledger": rows[name]["spend_usd"] if name in rows else 0.0,
                "utilisation_ledger": rows[name]["utilisation"] if name in rows else None,
                "usd_per_mtok": v["spend_usd"] / tokens_of[name] * 1e6 * time_scale
                if tokens_of.get(name)
                else None,
            }
            for name, v in sorted(paid.items())
        },
    }


def policy_report(
    scenario: Scenario,
    outcomes: Sequence[Outcome],
    cost_rows: Sequence[dict[str, Any]],
    wall_s: float,
    max_lag_s: float,
) -> dict[str, Any]:
    duration = scenario.spec.duration_s
    slo_of = {c.name: c.slo for c in scenario.spec.classes}
    cost = cost_summary(cost_rows, scenario.time_scale, scenario.fleet, wall_s)
    good_tokens = sum(
        o.prompt_tokens + o.completion_tokens for o in outcomes if met_slo(o, slo_of[o.request_class])
    )
    spend = cost["spend_usd"] * scenario.time_scale
    cost["usd_per_good_mtok"] = spend / good_tokens * 1e6 if good_tokens else None
    """Spend over the tokens of requests that met their SLO: what a useful token cost."""
    return {
        "wall_s": round(wall_s, 2),
        "sender_max_lag_ms": round(max_lag_s * 1000 * scenario.time_scale, 1),
        "overall": class_metrics(outcomes, slo_of, duration),
        "classes": {
            c.name: class_metrics([o for o in outcomes if o.request_class == c.name], slo_of, duration)
            for c in scenario.spec.classes
        },
        "split": split(outcomes),
        "split_over_time": split_over_time(outcomes, duration),
        "cost": cost,
        "samples": {
            c.name: {
                metric: [
                    round(v, 1)
                    for v in _ms([getattr(o, metric) for o in outcomes if o.ok and o.request_class == c.name])
                ]
                for metric in ("ttft", "tpot", "e2e")
            }
            for c in scenario.spec.classes
        },
    }


def scenario_header(scenario: Scenario, requests: int) -> dict[str, Any]:
    spec = scenario.spec
    return {
        "name": spec.name,
        "source": str(scenario.source),
        "description": spec.description,
        "seed": spec.seed,
        "duration_s": spec.duration_s,
        "time_scale": scenario.time_scale,
        "arrivals": {"process": type(spec.arrivals).__name__.lower(), **_fields(spec.arrivals)},
        "requests": requests,
        "fleet": [
            {
                "pool": g.pool,
                "vendor": g.vendor,
                "count": g.count,
                "gpus_per_backend": g.gpus_per_backend,
                "price_per_gpu_hour": g.price_per_gpu_hour,
                "gpu": g.profile.gpu if g.profile else None,
                "calibrated": g.profile.calibrated if g.profile else None,
                "model": (g.profile.model if g.profile else None) or g.model or scenario.fleet.model,
            }
            for g in scenario.fleet.groups
        ],
        "classes": {
            c.name: {"weight": c.weight, "n": c.n, "slo": {k: v for k, v in _fields(c.slo).items() if v}}
            for c in spec.classes
        },
    }


def _fields(struct: Any) -> dict[str, Any]:
    return {name: getattr(struct, name) for name in struct.__struct_fields__}


def format_table(report: dict[str, Any]) -> str:
    """The short terminal table: one row per policy and class, then the totals."""
    lines = [
        f"{'policy':<14} {'class':<12} {'reqs':>5} {'err':>4} {'SLO met':>8} {'goodput/s':>9} "
        f"{'TTFT p50/p99 ms':>16} {'TPOT p50/p99 ms':>16} {'tok/s':>7} {'$/Mtok':>7} {'$/Mgood':>7}"
        "  vendor split",
    ]
    for policy, data in report["policies"].items():
        rows = [*data["classes"].items(), ("ALL", data["overall"])]
        for cls, m in rows:
            cost = data["cost"]["usd_per_mtok"] if cls == "ALL" else None
            good = data["cost"]["usd_per_good_mtok"] if cls == "ALL" else None
            vendors = data["split"]["vendor"] if cls == "ALL" else {}
            lines.append(
                f"{policy:<14} {cls:<12} {m['requests']:>5} {m['errors']:>4} "
                f"{_pct(m['slo_attainment']):>8} {m['goodput_rps']:>9.2f} "
                f"{_pair(m['ttft_ms']):>16} {_pair(m['tpot_ms']):>16} {m['output_tokens_per_s']:>7.0f} "
                f"{'' if cost is None else f'{cost:.3f}':>7} {'' if good is None else f'{good:.3f}':>7}  "
                + " ".join(f"{k}={v}" for k, v in vendors.items())
            )
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _pair(s: dict[str, float | None]) -> str:
    p50, p99 = s.get("p50"), s.get("p99")
    if p50 is None or p99 is None:
        return "-"
    return f"{p50:.0f}/{p99:.0f}"
