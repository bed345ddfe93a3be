"""Does the what-if replay of a real run agree with the run? SLO attainment per class, both ways.

The real run went through a gateway with its access log on; each line says the request's class, its TTFT
as the gateway saw it and its whole duration. The replay (loadtest/whatif/replay.py) sends the same
arrivals through the same policy to a simulated copy of the backend timed by its calibrated profile. A
request attains its class's SLO when its TTFT and its time per output token are both within bounds.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.sim.fleet_spec import FleetSpec, GroupSpec, ProfileSpec
from gateway.ledger.records import AccessLine
from loadtest.stats import percentile
from loadtest.whatif.accesslog import Recorded, read_log
from loadtest.whatif.replay import Replay
from loadtest.whatif.simfleet import build_fleet
from policies.config import load_policy
from policies.engine import PolicyEngine

ATTAINMENT_POINTS = 0.05
"""How far apart the replay's and the real run's attainment may be, per class (the issue's bound)."""
DRAWS = 8
"""Replays averaged per attainment when the profile has slow spells (each draw moved it by up to 9
points on the recordings of docs/calibrate.md)."""


@dataclass(frozen=True, slots=True)
class ClassSlo:
    ttft_s: float
    tpot_s: float


def attained(ttft_s: float | None, tpot_s: float | None, slo: ClassSlo) -> bool:
    if ttft_s is None or ttft_s > slo.ttft_s:
        return False
    return tpot_s is None or tpot_s <= slo.tpot_s


def _shares(results: Iterable[tuple[str, bool]]) -> dict[str, float]:
    counts: dict[str, list[int]] = {}
    for cls, ok in results:
        tally = counts.setdefault(cls, [0, 0])
        tally[0] += ok
        tally[1] += 1
    return {cls: hits / total for cls, (hits, total) in sorted(counts.items())}


def logged_tpot(line: AccessLine) -> float | None:
    """A logged request's time per output token after its first (None: no first token, no duration or a
    one-token answer)."""
    if line.ttft_s is None or not line.duration_s or line.completion_tokens < 2:
        return None
    return (line.duration_s - line.ttft_s) / (line.completion_tokens - 1)


def slos_from_log(log: Path) -> dict[str, ClassSlo]:
    """Per class, bounds at the real run's own 80th percentiles of TTFT and time per output token, so
    about a fifth of each class misses and a replay that is off in either direction shows it."""
    ttfts: dict[str, list[float]] = {}
    tpots: dict[str, list[float]] = {}
    for request in read_log(log).requests:
        line = request.line
        tpot = logged_tpot(line)
        if line.ttft_s is None or tpot is None:
            continue
        ttfts.setdefault(line.request_class, []).append(line.ttft_s)
        tpots.setdefault(line.request_class, []).append(tpot)
    return {
        cls: ClassSlo(percentile(ttfts[cls], 80) or 0.0, percentile(tpots[cls], 80) or 0.0) for cls in ttfts
    }


def logged_attainment(log: Path, slos: dict[str, ClassSlo]) -> dict[str, float]:
    """Per class, the share of the logged requests that met their SLO (the real run's attainment)."""
    results = []
    for request in read_log(log).requests:
        line = request.line
        slo = slos.get(line.request_class)
        if slo is None:
            continue
        ok = line.status == 200 and attained(line.ttft_s, logged_tpot(line), slo)
        results.append((line.request_class, ok))
    return _shares(results)


def off_by_more(real: dict[str, float], replayed: dict[str, float]) -> list[str]:
    """The classes whose replayed attainment is more than `ATTAINMENT_POINTS` from the real run's."""
    return [cls for cls, share in real.items() if abs(replayed.get(cls, 0.0) - share) > ATTAINMENT_POINTS]


def calibrated_fleet(profile: Path, model: str, max_model_len: int, pool: str) -> FleetSpec:
    """One backend timed by a calibrated profile, in a pool named as the real gateway's."""
    return FleetSpec(
        model=model,
        max_model_len=max_model_len,
        groups=[
            GroupSpec(
                pool=pool,
                vendor="amd",
                accelerator="mi300x",
                price_per_gpu_hour=1.0,
                profile=ProfileSpec(calibrated=str(profile)),
            )
        ],
    )


@dataclass(frozen=True, slots=True)
class Replayed:
    """One request as one replay saw it."""

    ttft_s: float | None
    tpot_s: float | None
    ok: bool
    """Answered (not refused or failed by the replay)."""


def replayed_outcomes(
    requests: Sequence[Recorded],
    fleet: FleetSpec,
    policy: Path,
    scrape_interval_s: float = 0.2,
    draws: int = DRAWS,
) -> list[list[Replayed]]:
    """Per replay, each of `requests` (a log's, in arrival order: `read_log`): `draws` replays, each meeting
    its own draw of a calibrated profile's slow spells and front-end spread, or one when nothing is
    drawn (every replay would be the same)."""
    loaded = load_policy(policy)
    replays: list[list[Replayed]] = []
    for draw in range(draws):
        sims = build_fleet(fleet, draw)
        engine = PolicyEngine(loaded, [s.backend for s in sims])
        result = Replay(sims, engine, requests, scrape_interval_s).run()
        replays.append([Replayed(o.ttft, o.tpot, o.ok) for o in result.outcomes])
        if not any((sim.perf is not None and sim.perf.paced) or sim.front.cv > 0 for sim in sims):
            break
    return replays


def replayed_shares(
    requests: Sequence[Recorded], replays: Sequence[Sequence[Replayed]], slos: dict[str, ClassSlo]
) -> dict[str, float]:
    """Per class, the share of `requests` that met their SLO, over every replay of them
    (`replayed_outcomes`)."""
    results = []
    for replay in replays:
        for request, outcome in zip(requests, replay, strict=True):
            cls = request.line.request_class
            slo = slos.get(cls)
            if slo is not None:
                results.append((cls, outcome.ok and attained(outcome.ttft_s, outcome.tpot_s, slo)))
    return _shares(results)


def replayed_attainment(
    log: Path,
    fleet: FleetSpec,
    policy: Path,
    slos: dict[str, ClassSlo],
    scrape_interval_s: float = 0.2,
    draws: int = DRAWS,
) -> dict[str, float]:
    """Per class, the share of the log's requests the replay on `fleet` says would meet their SLO: the
    mean over `draws` replays (`replayed_outcomes`; one draw is one of many runs the server might have
    given; the real run is another)."""
    requests = read_log(log).requests
    return replayed_shares(
        requests, replayed_outcomes(requests, fleet, policy, scrape_interval_s, draws), slos
    )
