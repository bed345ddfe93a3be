"""Where a replay's SLO attainment departs from the real run's: per class and per load.

The check compares one share per class, and with bounds at the run's own 80th percentiles a few per cent
of bias in one corner of the load moves it by points: on the recordings of docs/calibrate.md the replay
met the TPOT bound for 75 % of the requests that arrived among nine or more others where the run met it
for 61 %, and within four points of it at lighter loads. This splits the log's requests by how many were in
flight when each arrived (read off the log itself) and shows, per part, how many met each bound in the run
and in the replays, and their medians, so a failed check says what to look at.

The check (check.py), the test (tests/calibrate) and the offline re-run of a recording
(`python -m loadtest.calibrate.offline DIR [--profile PROFILE]`) print it.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.sim.fleet_spec import FleetSpec
from loadtest.calibrate.agreement import ClassSlo, Replayed, logged_tpot, replayed_outcomes, replayed_shares
from loadtest.whatif.accesslog import Recorded, read_log

LOADS = ((0, 1), (2, 4), (5, 8), (9, 16), (17, None))
"""Requests in flight when a request arrived (itself not counted), as the parts the gap is shown in."""


@dataclass(frozen=True, slots=True)
class Part:
    cls: str
    load: str
    requests: int
    ttft_met: tuple[float, float]
    """The share within the class's TTFT bound: the real run's, the replays'."""
    tpot_met: tuple[float, float]
    ttft_p50_s: tuple[float, float]
    tpot_p50_s: tuple[float, float]


def in_flight(requests: Sequence[Recorded]) -> list[int]:
    """For each request (in arrival order), how many others had arrived and not yet ended when it came."""
    arrivals = [r.at_s for r in requests]
    ends = sorted(r.end_s for r in requests)
    return [bisect.bisect_left(arrivals, r.at_s) - bisect.bisect_right(ends, r.at_s) for r in requests]


def _label(low: int, high: int | None) -> str:
    return f"{low}+" if high is None else f"{low}-{high}"


def _median(values: Sequence[float | None]) -> float:
    """Of the values there are (no first token, a one-token answer or a failed request have none)."""
    present = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.median(present) if present else 0.0


def _met(values: list[float | None], bound: float, missing: bool) -> float:
    """The share within `bound`; a request without a value counts as `missing` (no first token misses,
    no time per output token, a one-token answer, meets: `agreement.attained`)."""
    return statistics.fmean(missing if v is None else v <= bound for v in values) if values else 0.0


def parts(
    requests: Sequence[Recorded], replays: Sequence[Sequence[Replayed]], slos: dict[str, ClassSlo]
) -> list[Part]:
    """The gap per class and load part (`LOADS`), over every replay."""
    loads = in_flight(requests)
    found: list[Part] = []
    for cls, slo in sorted(slos.items()):
        for low, high in LOADS:
            chosen = [
                i
                for i, r in enumerate(requests)
                if r.line.request_class == cls and loads[i] >= low and (high is None or loads[i] <= high)
            ]
            if not chosen:
                continue
            # a request that failed met neither bound (agreement.logged_attainment): no TTFT, an endless TPOT
            real_ok = [requests[i].line.status == 200 for i in chosen]
            real_ttft = [
                requests[i].line.ttft_s if ok else None for i, ok in zip(chosen, real_ok, strict=True)
            ]
            real_tpot = [
                logged_tpot(requests[i].line) if ok else math.inf
                for i, ok in zip(chosen, real_ok, strict=True)
            ]
            sim_ttft = [replay[i].ttft_s if replay[i].ok else None for replay in replays for i in chosen]
            sim_tpot = [replay[i].tpot_s if replay[i].ok else math.inf for replay in replays for i in chosen]
            found.append(
                Part(
                    cls,
                    _label(low, high),
                    len(chosen),
                    (_met(real_ttft, slo.ttft_s, False), _met(sim_ttft, slo.ttft_s, False)),
                    (_met(real_tpot, slo.tpot_s, True), _met(sim_tpot, slo.tpot_s, True)),
                    (_median(real_ttft), _median(sim_ttft)),
                    (_median(real_tpot), _median(sim_tpot)),
                )
            )
    return found


def replayed_with_parts(
    log: Path, fleet: FleetSpec, policy: Path, slos: dict[str, ClassSlo], scrape_s: float
) -> tuple[dict[str, float], list[Part]]:
    """The replay's attainment per class (as `agreement.replayed_attainment`) and where it departs from
    the run, from one set of replays of the log."""
    requests = read_log(log).requests
    replays = replayed_outcomes(requests, fleet, policy, scrape_s)
    return replayed_shares(requests, replays, slos), parts(requests, replays, slos)


def format_parts(found: Sequence[Part]) -> str:
    """One line per part; each pair is the real run's, then the replays'."""
    lines = [
        f"{'class':6} {'in flight':>9} {'requests':>8}  {'TTFT met %':>13}  {'TTFT p50 ms':>15}"
        f"  {'TPOT met %':>13}  {'TPOT p50 ms':>13}"
    ]
    for p in found:
        lines.append(
            f"{p.cls:6} {p.load:>9} {p.requests:8}  {p.ttft_met[0] * 100:5.1f} / {p.ttft_met[1] * 100:5.1f}"
            f"  {p.ttft_p50_s[0] * 1e3:6.2f} / {p.ttft_p50_s[1] * 1e3:6.2f}"
            f"  {p.tpot_met[0] * 100:5.1f} / {p.tpot_met[1] * 100:5.1f}"
            f"  {p.tpot_p50_s[0] * 1e3:5.2f} / {p.tpot_p50_s[1] * 1e3:5.2f}"
        )
    return "\n".join(lines)
