"""How many batch lines one backend may run right now without hurting online traffic: a pure decision on
what the gateway knows at that moment (no I/O), so it can be tested on constructed backend states.

Per backend, from the tightest online route that may send requests there (its `prefer` or `fallback`):

    pause (no new line) when   it is unhealthy or drained;
                               any request waits in the gateway's back-pressure queues;
                               any request waits in vLLM's own queue (scraped `waiting`);
                               predicted online TTFT or TPOT (policies/predict.py) passes
                                   `slo_margin` x the route's SLO.
    otherwise its cap is       the lines already running + the new ones that fit in
                               min(KV room, TPOT room), at most `max_per_backend` (a full KV cache
                               is no pause: it is measured, not an average, and a line that ends
                               leaves room for the next at once):
        KV room     (online KV limit - reserve - scraped usage) / KV of one sequence (usage / running)
        TPOT room   (margin x TPOT SLO - predicted TPOT) / TPOT each running sequence has added over
                    the unloaded backend's
    and, while online requests run on it, at most allowed slowdown / (what one line slows their
    decode: gateway/batch/slowdown.py). The allowed slowdown is each running class's TPOT headroom,
    `slo_margin` x its route's TPOT SLO over the predicted TPOT, less 1, the least of the classes
    running there (the gateway counts its in-flight requests per backend and class); at least
    `max_online_slowdown`, and only that when a class running there has no TPOT SLO in the policy
    (it is protected whatever its SLO is);
    less the lines sent since the last scrape (not yet in the scraped figures); and at most
    `ramp_lines` more than ran at the last scrape (lines that end are replaced at once), so the room
    is measured again before more are added (additive increase), and a burst of batch prefills never
    lands in front of online requests.

vLLM batches decode: one decode step streams the weights once for every running sequence, so a backend
with KV room turns extra sequences into tokens at a small TPOT cost. That room is what batch lines fill;
the reserve is what an online burst finds free when it arrives, and the pause keeps it free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from backends.models import Backend
from gateway.batch.slowdown import slowdown_cap
from policies.config import Route
from policies.predict import predicted_tpot, predicted_ttft
from policies.selectors import selects


@dataclass(frozen=True, slots=True)
class HeadroomLimits:
    kv_reserve: float = 0.2
    """KV cache fraction kept free for online bursts."""
    slo_margin: float = 0.75
    """Pause when predicted online TTFT or TPOT reaches this fraction of the SLO."""
    max_per_backend: int = 48
    ramp_lines: int = 2
    """New lines a backend gets per scrape at most: the headroom is re-measured before more are added,
    and their prefills never arrive at once in front of online requests."""
    default_kv_limit: float = 0.95
    """KV limit when no online route sets one for the backend."""
    max_online_slowdown: float = 0.02
    """While online requests run on a backend, its batch lines may slow their decode by this fraction."""


@dataclass(frozen=True, slots=True)
class OnlineLimits:
    """The tightest online requirements on one pool: its SLOs and KV saturation limit."""

    ttft_s: float | None = None
    tpot_s: float | None = None
    max_kv: float = 0.95
    class_tpot_s: dict[str, float | None] = field(default_factory=dict)
    """Each online class that may run here: its route's TPOT SLO (None when it states none)."""


def online_limits(routes: dict[str, Route], backend: Backend, default_kv: float = 0.95) -> OnlineLimits:
    """The tightest SLO and KV limit of the online routes that may send requests to `backend`."""
    ttft: float | None = None
    tpot: float | None = None
    max_kv = default_kv
    class_tpot: dict[str, float | None] = {}
    for name, route in routes.items():
        if not (selects(route.prefer, backend.pool) or selects(route.fallback, backend.pool)):
            continue
        max_kv = min(max_kv, route.saturation.max_kv_cache_usage)
        slo = route.slo
        class_tpot[name] = slo.tpot_ms / 1000 if slo is not None and slo.tpot_ms is not None else None
        if slo is None:
            continue
        if slo.ttft_ms is not None:
            ttft = min(ttft, slo.ttft_ms / 1000) if ttft is not None else slo.ttft_ms / 1000
        if slo.tpot_ms is not None:
            tpot = min(tpot, slo.tpot_ms / 1000) if tpot is not None else slo.tpot_ms / 1000
    return OnlineLimits(ttft, tpot, max_kv, class_tpot)


@dataclass(slots=True)
class BatchLoad:
    """This replica's batch lines on one backend."""

    lines: int = 0
    unseen: int = 0
    """Lines sent after the backend's last scrape: not yet in its running / KV figures."""
    settled: int | None = None
    """Lines that were running at the last scrape (None: lines - unseen). The ramp counts from there, so
    a line that ends is replaced at once; only growth waits for the next scrape."""
    online: int = 0
    """Online (not batch) requests this replica has in flight on the backend."""
    line_cost: float = 0.0
    """The fraction of an online decode step one batch line adds there (gateway/batch/slowdown.py)."""
    online_classes: dict[str, int] = field(default_factory=dict)
    """The online requests by class (only classes with some in flight)."""


@dataclass(frozen=True, slots=True)
class Room:
    backend: Backend
    cap: int
    """Batch lines the backend may run now (this replica's, those running included)."""
    free: int
    """New lines it may take now: cap - lines running, never negative."""
    cost_per_mtok: float
    paused: str | None = None
    """Why it takes no new line (None when it may, or when it is simply full)."""


def cost_per_mtok(backend: Backend) -> float:
    """Measured USD per million tokens (the ledger's), else the accelerator's floor."""
    measured = backend.measured_cost_per_mtok
    return measured if measured is not None else backend.pool.cost_floor_per_mtok


def pause_reason(backend: Backend, online: OnlineLimits, queued: int, limits: HeadroomLimits) -> str | None:
    if not backend.healthy or backend.draining:
        return "unavailable"
    if queued > 0:
        return f"{queued} requests wait in the gateway's queues"
    load = backend.load
    if load.waiting > 0:
        return f"{load.waiting:g} requests wait in its queue"
    margin = limits.slo_margin
    if online.ttft_s is not None:
        ttft = predicted_ttft(backend)
        if ttft > margin * online.ttft_s:
            return f"predicted TTFT {ttft * 1000:.0f} ms near the SLO {online.ttft_s * 1000:g} ms"
    if online.tpot_s is not None:
        tpot = predicted_tpot(backend)
        if tpot > margin * online.tpot_s:
            return f"predicted TPOT {tpot * 1000:.1f} ms near the SLO {online.tpot_s * 1000:g} ms"
    return None


def new_lines(backend: Backend, online: OnlineLimits, limits: HeadroomLimits) -> int:
    """Sequences the backend can add before its KV room or its online TPOT room runs out."""
    load = backend.load
    running = load.running
    if running < 1 or load.kv_cache_usage <= 0:
        return limits.ramp_lines  # nothing to measure the KV of one sequence on yet
    kv_room = online.max_kv - limits.kv_reserve - load.kv_cache_usage
    room = kv_room / (load.kv_cache_usage / running)
    if online.tpot_s is not None and backend.observed.tpot is not None:
        added = (backend.observed.tpot - backend.pool.prior_tpot_s) / running
        if added > 0:
            room = min(room, (limits.slo_margin * online.tpot_s - predicted_tpot(backend)) / added)
    return max(0, math.floor(room + 1e-9))


def allowed_slowdown(
    backend: Backend, running: dict[str, int], online: OnlineLimits, limits: HeadroomLimits
) -> float:
    """How much batch lines may slow the decode of the online classes running on `backend`: the least
    TPOT headroom among them, never under `max_online_slowdown`, and only that when one of them has no
    TPOT SLO (or is not a route of the policy that may run here)."""
    floor = limits.max_online_slowdown
    if not running:
        return floor
    predicted = predicted_tpot(backend)
    if predicted <= 0:
        return floor
    allowed = math.inf
    for cls in running:
        slo = online.class_tpot_s.get(cls)
        if slo is None:
            return floor
        allowed = min(allowed, limits.slo_margin * slo / predicted - 1.0)
    return max(floor, allowed)


def assess(
    backend: Backend, batch: BatchLoad, online: OnlineLimits, queued: int, limits: HeadroomLimits
) -> Room:
    cost = cost_per_mtok(backend)
    why = pause_reason(backend, online, queued, limits)
    if why is not None:
        return Room(backend, batch.lines, 0, cost, why)
    seen = batch.lines - batch.unseen
    ramped = (seen if batch.settled is None else batch.settled) + limits.ramp_lines
    cap = min(limits.max_per_backend, seen + new_lines(backend, online, limits), ramped)
    allowed = allowed_slowdown(backend, batch.online_classes, online, limits)
    slowed = slowdown_cap(batch.online, batch.line_cost, allowed)
    if slowed is not None:
        cap = min(cap, slowed)
    return Room(backend, max(cap, 0), max(0, cap - batch.lines), cost)


def fill_order(rooms: list[Room]) -> list[Room]:
    """Backends that may take lines: cheapest first, then the one with the most headroom."""
    return sorted((r for r in rooms if r.free > 0), key=lambda r: (round(r.cost_per_mtok, 3), -r.free))
