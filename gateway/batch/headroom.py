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
    decode: gateway/batch/slowdown.py). The allowed slowdown is the least headroom of the classes
    running there (the gateway counts its in-flight requests per backend and class): a class's TPOT
    headroom, `slo_margin` x its route's TPOT SLO over the predicted TPOT, less 1; for a class with a
    TTFT SLO and no TPOT SLO (long prompts) its TTFT headroom, `slo_margin` x its TTFT SLO over the
    predicted TTFT, less 1 (a step slowed by a fraction stretches the prefill whose chunks run in it
    by as much). At least `max_online_slowdown`, and only that when a class running there has no SLO
    in the policy (it is protected whatever its SLO is);
    less the lines sent since the last scrape (not yet in the scraped figures); and at most
    `ramp_lines` more than ran at the last scrape (lines that end are replaced at once), so the room
    is measured again before more are added (additive increase), and a burst of batch prefills never
    lands in front of online requests. A backend no online request runs on ramps by the lines whose
    prompts it prefills within the tightest TTFT headroom there (`slo_margin` x TTFT SLO - predicted
    TTFT): an online request arriving behind them still meets the margin.

A pause on a queue is measured at each scrape and ends when a scrape shows it empty; a pause on a
predicted latency (an average) ends after a quiet spell (gateway/batch/capacity.py).

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
from policies.predict import predicted_tpot, predicted_ttft, prefill_speed
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
    class_ttft_s: dict[str, float | None] = field(default_factory=dict)
    """Each online class that may run here: its route's TTFT SLO (None when it states none)."""


def online_limits(
    routes: dict[str, Route], backend: Backend, default_kv: float = 0.95, lowest: str | None = None
) -> OnlineLimits:
    """The tightest SLO and KV limit of the online routes that may send requests to `backend`.

    The route named `lowest` (the class batch lines run as) sets no tightest limit: the scheduler's lines
    are its requests too. Its SLOs still protect the online requests of that class (a client's own
    deferrable jobs) from the lines, like any other class's."""
    ttft: float | None = None
    tpot: float | None = None
    max_kv = default_kv
    class_tpot: dict[str, float | None] = {}
    class_ttft: dict[str, float | None] = {}
    for name, route in routes.items():
        if not (selects(route.prefer, backend.pool) or selects(route.fallback, backend.pool)):
            continue
        slo = route.slo
        class_tpot[name] = slo.tpot_ms / 1000 if slo is not None and slo.tpot_ms is not None else None
        class_ttft[name] = slo.ttft_ms / 1000 if slo is not None and slo.ttft_ms is not None else None
        if name == lowest:
            continue
        max_kv = min(max_kv, route.saturation.max_kv_cache_usage)
        if slo is None:
            continue
        if slo.ttft_ms is not None:
            ttft = min(ttft, slo.ttft_ms / 1000) if ttft is not None else slo.ttft_ms / 1000
        if slo.tpot_ms is not None:
            tpot = min(tpot, slo.tpot_ms / 1000) if tpot is not None else slo.tpot_ms / 1000
    return OnlineLimits(ttft, tpot, max_kv, class_tpot, class_ttft)


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
    prompt_tokens: float = 1000.0
    """Prompt tokens of one line (a moving average): what a line brings to the backend's prefill."""


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
    averaged: bool = False
    """The pause rests on a latency average, which may dip under the margin for a moment on a busy
    backend: it resumes only after a quiet spell. A queue is measured at each scrape: once a scrape shows
    it empty, the backend resumes at once (a momentary queue, a long prompt's prefill filling a step's
    token budget, would otherwise hold it a whole spell)."""


def cost_per_mtok(backend: Backend) -> float:
    """Measured USD per million tokens (the ledger's), else the accelerator's floor."""
    measured = backend.measured_cost_per_mtok
    return measured if measured is not None else backend.pool.cost_floor_per_mtok


def queue_reason(backend: Backend, queued: int) -> str | None:
    """A pause on what is measured now: the backend is unavailable, or requests queue for it."""
    if not backend.healthy or backend.draining:
        return "unavailable"
    if queued > 0:
        return f"{queued} requests wait in the gateway's queues"
    load = backend.load
    if load.waiting > 0:
        return f"{load.waiting:g} requests wait in its queue"
    return None


def latency_reason(backend: Backend, online: OnlineLimits, limits: HeadroomLimits) -> str | None:
    """A pause on the predicted online latency (an average of recent requests) near an SLO."""
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
    """How much batch lines may slow the online classes running on `backend`: the least headroom among
    them, never under `max_online_slowdown`. A class's headroom is its TPOT SLO's (`slo_margin` x SLO
    over the predicted TPOT, less 1); a class with no TPOT SLO but a TTFT SLO has its TTFT SLO's, as a
    step slowed by a fraction stretches the prefill of a prompt (chunks of it run in those steps) by as
    much; a class with neither (or not a route of the policy that may run here) has only the floor."""
    floor = limits.max_online_slowdown
    if not running:
        return floor
    allowed = math.inf
    tpot = ttft = 0.0
    for cls in running:
        slo = online.class_tpot_s.get(cls)
        if slo is not None:
            tpot = tpot or predicted_tpot(backend)
            headroom = limits.slo_margin * slo / tpot - 1.0 if tpot > 0 else floor
        elif (first := online.class_ttft_s.get(cls)) is not None:
            ttft = ttft or predicted_ttft(backend)
            headroom = limits.slo_margin * first / ttft - 1.0 if ttft > 0 else floor
        else:
            return floor
        allowed = min(allowed, headroom)
    return max(floor, allowed)


def prefill_ramp(backend: Backend, online: OnlineLimits, prompt_tokens: float, limits: HeadroomLimits) -> int:
    """New lines a backend with no online request on it may take at once: as many as it prefills within
    the TTFT headroom of the tightest online route that may send there (`slo_margin` x its TTFT SLO less
    the predicted TTFT), so an online request that arrives behind their prompts still meets the margin.
    At least `ramp_lines`; `max_per_backend` when no online route states a TTFT SLO here."""
    if online.ttft_s is None:
        return limits.max_per_backend
    headroom = limits.slo_margin * online.ttft_s - predicted_ttft(backend)
    fits = math.floor(headroom * prefill_speed(backend) / max(prompt_tokens, 1.0) + 1e-9)
    return max(limits.ramp_lines, fits)


def assess(
    backend: Backend, batch: BatchLoad, online: OnlineLimits, queued: int, limits: HeadroomLimits
) -> Room:
    cost = cost_per_mtok(backend)
    why = queue_reason(backend, queued)
    if why is not None:
        return Room(backend, batch.lines, 0, cost, why)
    why = latency_reason(backend, online, limits)
    if why is not None:
        return Room(backend, batch.lines, 0, cost, why, averaged=True)
    seen = batch.lines - batch.unseen
    ramp = limits.ramp_lines
    if batch.online <= 0:
        ramp = prefill_ramp(backend, online, batch.prompt_tokens, limits)
    ramped = (seen if batch.settled is None else batch.settled) + ramp
    cap = min(limits.max_per_backend, seen + new_lines(backend, online, limits), ramped)
    allowed = allowed_slowdown(backend, batch.online_classes, online, limits)
    slowed = slowdown_cap(batch.online, batch.line_cost, allowed)
    if slowed is not None:
        cap = min(cap, slowed)
    return Room(backend, max(cap, 0), max(0, cap - batch.lines), cost)


def fill_order(rooms: list[Room]) -> list[Room]:
    """Backends that may take lines: cheapest first, then the one with the most headroom."""
    return sorted((r for r in rooms if r.free > 0), key=lambda r: (round(r.cost_per_mtok, 3), -r.free))


def picks(rooms: list[Room]) -> list[Backend]:
    """One backend per free slot, in the order lines should take them: a slot of each backend in fill
    order, then a second of each, and so on. While lines are plentiful every slot is taken and the order
    does not matter; when few are left (the end of a batch) they spread over every backend with room
    instead of piling onto the cheapest, where each would decode in a larger batch and end later."""
    order = fill_order(rooms)
    out: list[Backend] = []
    for turn in range(max((r.free for r in order), default=0)):
        out.extend(r.backend for r in order if r.free > turn)
    return out
