"""Batch headroom: where batch lines may run, how many, and when dispatch pauses, on constructed backends."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest

from backends.models import Backend, EngineLoad, Observed, Pool
from gateway.batch.capacity import FleetRoom
from gateway.batch.headroom import (
    BatchLoad,
    HeadroomLimits,
    OnlineLimits,
    Room,
    allowed_slowdown,
    assess,
    fill_order,
    latency_reason,
    new_lines,
    online_limits,
    picks,
    queue_reason,
)
from gateway.batch.slowdown import LineShape, line_cost, slowdown_cap
from policies.config import Route

H100 = Pool(
    "h100", "nvidia", "h100", 2, 2.9, {}, prior_ttft_s=0.05, prior_tpot_s=0.01, cost_floor_per_mtok=3.0
)
MI300X = Pool(
    "mi300x", "amd", "mi300x", 1, 1.75, {}, prior_ttft_s=0.08, prior_tpot_s=0.02, cost_floor_per_mtok=1.0
)
LIMITS = HeadroomLimits(kv_reserve=0.2, slo_margin=0.75, max_per_backend=48, ramp_lines=100)
"""No ramp: the room alone sets the cap."""
RAMPED = HeadroomLimits(kv_reserve=0.2, slo_margin=0.75, max_per_backend=48, ramp_lines=2)
ONLINE = OnlineLimits(ttft_s=0.8, tpot_s=0.06, max_kv=0.9)


def _backend(
    pool: Pool = H100,
    *,
    running: float = 0,
    waiting: float = 0,
    kv: float = 0.0,
    ttft: float | None = None,
    tpot: float | None = None,
    inflight: int = 0,
    cost: float | None = None,
    name: str = "b",
) -> Backend:
    return Backend(
        name=name,
        url="http://127.0.0.1:1",
        models=frozenset({"m"}),
        max_model_len=8192,
        pool=pool,
        inflight=inflight,
        measured_cost_per_mtok=cost,
        load=EngineLoad(running=running, waiting=waiting, kv_cache_usage=kv, scraped_at=0.0),
        observed=Observed(ttft=ttft, tpot=tpot),
    )


def _route(**fields: Any) -> Route:
    return msgspec.convert(fields, Route)


def test_kv_room_sets_the_cap_less_the_reserve() -> None:
    # 6 sequences use 30% of the KV cache: 5% each; room to 90% - 20% reserve is 40%: 8 more sequences.
    backend = _backend(running=6, kv=0.30, ttft=0.1, tpot=0.01)
    room = assess(backend, BatchLoad(lines=2), ONLINE, 0, LIMITS)
    assert room.paused is None
    assert (room.cap, room.free) == (10, 8)


def test_lines_sent_since_the_last_scrape_count_against_the_room() -> None:
    backend = _backend(running=6, kv=0.30, ttft=0.1, tpot=0.01)
    room = assess(backend, BatchLoad(lines=5, unseen=3), ONLINE, 0, LIMITS)
    assert (room.cap, room.free) == (10, 5)


def test_tpot_room_limits_the_cap_when_decode_slows_with_each_sequence() -> None:
    # Each of 10 running sequences added 2 ms over the unloaded 10 ms; 0.75 x 60 ms = 45 ms leaves 15 ms: 7.
    backend = _backend(running=10, kv=0.10, ttft=0.1, tpot=0.03)
    assert new_lines(backend, ONLINE, LIMITS) == 7
    assert assess(backend, BatchLoad(), ONLINE, 0, LIMITS).free == 7


def test_a_backend_never_measured_gets_ramp_lines_only() -> None:
    backend = _backend()
    assert assess(backend, BatchLoad(), ONLINE, 0, RAMPED).free == 2
    assert assess(backend, BatchLoad(lines=2, unseen=2), ONLINE, 0, RAMPED).free == 0


def test_room_is_filled_a_ramp_at_a_time_per_scrape_while_online_requests_run() -> None:
    backend = _backend(running=6, kv=0.30, ttft=0.1, tpot=0.01)  # room for 8
    assert assess(backend, BatchLoad(lines=2, online=1), ONLINE, 0, RAMPED).free == 2
    assert assess(backend, BatchLoad(lines=3, unseen=1, online=1), ONLINE, 0, RAMPED).free == 1
    assert assess(backend, BatchLoad(lines=4, unseen=2, online=1), ONLINE, 0, RAMPED).free == 0
    full = _backend(running=14, kv=0.70, ttft=0.1, tpot=0.01)
    assert assess(full, BatchLoad(lines=10, online=1), ONLINE, 0, RAMPED).free == 0


def test_cap_never_exceeds_the_per_backend_ceiling() -> None:
    backend = _backend(running=1, kv=0.001, ttft=0.1, tpot=0.01)
    room = assess(backend, BatchLoad(lines=40), ONLINE, 0, LIMITS)
    assert (room.cap, room.free) == (48, 8)


def test_waiting_in_vllm_pauses_and_resumes_when_the_queue_empties() -> None:
    backend = _backend(running=6, kv=0.30, waiting=1, ttft=0.1, tpot=0.01)
    room = assess(backend, BatchLoad(lines=4), ONLINE, 0, LIMITS)
    assert room.free == 0 and room.paused is not None and "wait in its queue" in room.paused
    assert room.cap == 4  # the running lines go on; only new ones are held back
    backend.load.waiting = 0
    assert assess(backend, BatchLoad(lines=4), ONLINE, 0, LIMITS).free == 8


def test_a_request_queued_in_the_gateway_pauses_every_backend() -> None:
    backend = _backend(running=1, kv=0.05, ttft=0.1, tpot=0.01)
    assert queue_reason(backend, 1) == "1 requests wait in the gateway's queues"
    assert queue_reason(backend, 0) is None and latency_reason(backend, ONLINE, LIMITS) is None


@pytest.mark.parametrize(
    ("ttft", "tpot", "paused"),
    [
        (0.59, 0.01, False),  # under 0.75 x 800 ms
        (0.61, 0.01, True),  # past it: online TTFT nears the SLO
        (0.1, 0.044, False),
        (0.1, 0.046, True),  # past 0.75 x 60 ms
    ],
)
def test_predicted_online_latency_near_the_slo_pauses(ttft: float, tpot: float, paused: bool) -> None:
    backend = _backend(running=2, kv=0.1, ttft=ttft, tpot=tpot)
    assert queue_reason(backend, 0) is None
    assert (latency_reason(backend, ONLINE, LIMITS) is not None) is paused


def test_waiting_pauses_a_backend_no_online_slo_covers() -> None:
    backend = _backend(running=2, kv=0.1, ttft=0.3, waiting=2)
    assert queue_reason(backend, 0) == "2 requests wait in its queue"


def test_kv_at_the_online_limit_less_the_reserve_takes_no_new_line_without_pausing() -> None:
    backend = _backend(running=10, kv=0.71, ttft=0.1, tpot=0.01)
    full = assess(backend, BatchLoad(lines=8), ONLINE, 0, LIMITS)
    assert (full.cap, full.free, full.paused) == (8, 0, None)  # no resume delay once lines end
    backend.load.kv_cache_usage = 0.63  # 7% room, 6.3% per sequence: one more
    assert assess(backend, BatchLoad(lines=8), ONLINE, 0, LIMITS).free == 1


def test_lines_that_end_are_replaced_at_once_only_growth_waits_for_a_scrape() -> None:
    backend = _backend(running=10, kv=0.30, ttft=0.1, tpot=0.01)  # KV room for 13 more
    # 10 ran at the last scrape, 4 ended since: 4 replacements + the ramp's 2.
    ended = assess(backend, BatchLoad(lines=6, settled=10, online=1), ONLINE, 0, RAMPED)
    assert (ended.cap, ended.free) == (12, 6)


def test_unhealthy_or_drained_backends_get_nothing() -> None:
    sick = _backend()
    sick.healthy = False
    drained = _backend()
    drained.draining = True
    for backend in (sick, drained):
        assert assess(backend, BatchLoad(), ONLINE, 0, LIMITS).free == 0


def test_online_limits_are_the_tightest_of_routes_that_may_send_there() -> None:
    routes = {
        "chat": _route(
            prefer={"vendor": "nvidia"}, fallback={"vendor": "amd"}, slo={"ttft_ms": 800, "tpot_ms": 60}
        ),
        "long": _route(prefer={"accelerator": "mi300x"}, saturation={"max_kv_cache_usage": 0.85}),
        "default": _route(prefer="any", slo={"ttft_ms": 2000, "tpot_ms": 100}),
        "fast": _route(prefer={"accelerator": "h100"}, slo={"ttft_ms": 300}),
    }
    amd = online_limits(routes, _backend(MI300X))
    assert (amd.ttft_s, amd.tpot_s, amd.max_kv) == (0.8, 0.06, 0.85)
    assert amd.class_tpot_s == {"chat": 0.06, "long": None, "default": 0.1}
    nvidia = online_limits(routes, _backend(H100))
    assert nvidia.ttft_s == 0.3 and nvidia.tpot_s == 0.06
    assert nvidia.class_tpot_s == {"chat": 0.06, "default": 0.1, "fast": None}
    assert online_limits({}, _backend(H100)) == OnlineLimits(None, None, 0.95)


def test_fill_order_is_cheapest_first_then_most_headroom_whatever_the_pool() -> None:
    cheap_small = _backend(MI300X, cost=1.0, name="cheap-small")
    cheap_big = _backend(MI300X, cost=1.0, name="cheap-big")
    dear = _backend(H100, cost=4.0, name="dear")
    full = _backend(MI300X, cost=0.5, name="full")
    rooms = [
        assess(dear, BatchLoad(), ONLINE, 0, RAMPED),
        assess(cheap_small, BatchLoad(lines=1, unseen=1), ONLINE, 0, RAMPED),
        assess(cheap_big, BatchLoad(), ONLINE, 0, RAMPED),
        assess(full, BatchLoad(lines=2, unseen=2), ONLINE, 0, RAMPED),
    ]
    assert [r.backend.name for r in fill_order(rooms)] == ["cheap-big", "cheap-small", "dear"]


def test_unmeasured_cost_falls_back_to_the_accelerator_floor() -> None:
    rooms = [assess(_backend(H100, name="h"), BatchLoad(), ONLINE, 0, RAMPED)]
    rooms.append(assess(_backend(MI300X, name="m"), BatchLoad(), ONLINE, 0, RAMPED))
    assert [r.backend.name for r in fill_order(rooms)] == ["m", "h"]


def test_fleet_room_counts_its_own_lines_and_those_the_scrape_has_not_seen() -> None:
    backend = _backend(running=6, kv=0.30, ttft=0.1, tpot=0.01)
    catalog = SimpleNamespace(serving=lambda model: [backend])
    pipeline = SimpleNamespace(router=None, queued=0)
    room = FleetRoom(catalog, pipeline, LIMITS)  # type: ignore[arg-type]
    # No policy: no online route limits KV below the default 95%; (95% - 20% - 30%) / 5% = 9.
    assert room.plan("m") == [backend] * 9
    for _ in range(3):
        room.started(backend)
    assert len(room.plan("m")) == 6  # sent after the last scrape: not in its KV figure yet
    backend.load.scraped_at = 1e12  # a scrape after they were sent, which shows them running
    backend.load.running, backend.load.kv_cache_usage = 9, 0.45
    assert len(room.plan("m")) == 6
    pipeline.queued = 1
    assert room.plan("m") == []
    pipeline.queued = 0
    room.ended(backend)
    assert room.lines[backend] == 2


def _policy_router(routes: dict[str, Route]) -> Any:
    from policies.engine import PolicyEngine

    router = PolicyEngine.__new__(PolicyEngine)
    router.loaded = SimpleNamespace(policy=SimpleNamespace(routes=routes))  # type: ignore[attr-defined]
    return router


def test_a_backend_paused_on_predicted_latency_resumes_only_after_a_quiet_spell() -> None:
    backend = _backend(running=6, kv=0.30, ttft=0.7, tpot=0.01)  # past 0.75 x 800 ms
    routes = {"chat": _route(prefer="any", slo={"ttft_ms": 800}, saturation={"max_kv_cache_usage": 0.95})}
    catalog = SimpleNamespace(serving=lambda model: [backend])
    pipeline = SimpleNamespace(router=_policy_router(routes), queued=0)
    held = FleetRoom(catalog, pipeline, LIMITS, resume_after_s=3600)  # type: ignore[arg-type]
    at_once = FleetRoom(catalog, pipeline, LIMITS, resume_after_s=0)  # type: ignore[arg-type]
    assert held.plan("m") == [] and at_once.plan("m") == []
    backend.observed.ttft = 0.1  # the average dipped a moment ago
    assert held.plan("m") == []
    assert len(at_once.plan("m")) == 9
    never_paused = FleetRoom(catalog, pipeline, LIMITS, resume_after_s=3600)  # type: ignore[arg-type]
    assert len(never_paused.plan("m")) == 9


def test_a_backend_paused_on_a_queue_resumes_once_a_scrape_shows_it_empty() -> None:
    backend = _backend(running=6, kv=0.30, waiting=1, ttft=0.1, tpot=0.01)
    catalog = SimpleNamespace(serving=lambda model: [backend])
    pipeline = SimpleNamespace(router=None, queued=0)
    room = FleetRoom(catalog, pipeline, LIMITS, resume_after_s=3600)  # type: ignore[arg-type]
    assert room.plan("m") == []
    backend.load.waiting = 0  # a long prompt filled a step's token budget for a moment
    assert len(room.plan("m")) == 9
    pipeline.queued = 2
    assert room.plan("m") == []
    pipeline.queued = 0
    assert len(room.plan("m")) == 9


# --- the online slowdown cap (gateway/batch/slowdown.py) -----------------------------------------------


def test_a_line_costs_its_prefill_spread_over_its_decode_steps_plus_its_kv_read() -> None:
    shape = LineShape(prompt_tokens=1000, output_tokens=200)
    # MI300X prefills ~310 prompt tokens in one decode step's time: 1000 / (310 x 200) + 1200 x 2.5e-6.
    assert line_cost("mi300x", shape) == pytest.approx(1000 / 62_000 + 0.003)
    # H100 reads memory faster for its compute: the same prefill costs more decode steps.
    assert line_cost("h100", shape) > line_cost("mi300x", shape)
    # An accelerator the table does not know gets the costliest prefill.
    assert line_cost("tpu-v9", shape) >= line_cost("h200", shape)
    # Long answers amortise the prefill: a line with 4x the output costs about a quarter as much.
    long = LineShape(prompt_tokens=1000, output_tokens=800)
    assert line_cost("mi300x", long) < line_cost("mi300x", shape) / 2


def test_line_shape_follows_the_usage_of_finished_lines() -> None:
    shape = LineShape(prompt_tokens=1000, output_tokens=200, weight=0.5)
    shape.observe(3000, 0)  # an embedding: no output tokens, costed as one step
    assert (shape.prompt_tokens, shape.output_tokens) == (2000, 100.5)


@pytest.mark.parametrize(
    ("online", "cost", "fraction", "cap"),
    [
        (0, 0.02, 0.05, None),  # nothing online to slow: the KV / SLO room decides
        (1, 0.02, 0.05, 2),  # 2 x 2% <= 5% < 3 x 2%
        (30, 0.02, 0.05, 2),  # the fraction is per online request, however many there are
        (3, 0.026, 0.02, 0),  # one line would slow them by more than the fraction
        (3, 0.01, 0.05, 5),
    ],
)
def test_slowdown_cap(online: int, cost: float, fraction: float, cap: int | None) -> None:
    assert slowdown_cap(online, cost, fraction) == cap


def test_online_requests_cap_a_backend_whose_other_limits_have_room() -> None:
    backend = _backend(MI300X, running=6, kv=0.30, ttft=0.1, tpot=0.01)  # KV room for 8
    limits = HeadroomLimits(kv_reserve=0.2, slo_margin=0.75, ramp_lines=100, max_online_slowdown=0.05)
    alone = assess(backend, BatchLoad(lines=2, online=0, line_cost=0.02), ONLINE, 0, limits)
    assert (alone.cap, alone.free) == (10, 8)
    shared = assess(backend, BatchLoad(lines=2, online=4, line_cost=0.02), ONLINE, 0, limits)
    assert (shared.cap, shared.free, shared.paused) == (2, 0, None)
    over = assess(backend, BatchLoad(lines=5, online=1, line_cost=0.02), ONLINE, 0, limits)
    assert (over.cap, over.free) == (2, 0)  # the lines running finish; no new one until under the cap


def test_no_online_slo_needed_the_cap_protects_classes_the_policy_does_not_know() -> None:
    backend = _backend(MI300X, running=4, kv=0.20, ttft=0.1, tpot=0.07)
    no_slo = OnlineLimits(max_kv=0.95)
    limits = HeadroomLimits(max_online_slowdown=0.05)
    room = assess(backend, BatchLoad(online=4, line_cost=0.0186), no_slo, 0, limits)
    assert room.cap == 2  # 5% / 1.86% per line
    assert assess(backend, BatchLoad(online=4, line_cost=0.0186), no_slo, 0, LIMITS).cap == 1  # 2%


def _line_context(backend: Backend, holding: bool) -> Any:
    return SimpleNamespace(backend=backend, holding=holding)


def test_fleet_room_counts_online_requests_as_in_flight_less_its_lines_holding_a_slot() -> None:
    backend = _backend(MI300X, running=6, kv=0.30, ttft=0.1, tpot=0.01, inflight=5)
    catalog = SimpleNamespace(serving=lambda model: [backend])
    pipeline = SimpleNamespace(router=None, queued=0)
    room = FleetRoom(catalog, pipeline, LIMITS)  # type: ignore[arg-type]
    room.shape = LineShape(prompt_tokens=1000, output_tokens=200)  # 1.9% of a step per line on MI300X
    for line in range(2):
        room.started(backend)
        room.contexts[line] = _line_context(backend, holding=True)
    # 5 in flight, 2 of them these lines: 3 online requests, so at most 2 lines (5% / 1.9%): none new.
    assert room.plan("m") == []
    room.contexts[1] = _line_context(backend, holding=False)  # not holding its slot yet: 4 online
    assert room.plan("m") == []
    backend.inflight = 2  # only the two lines: nothing online to slow; the KV room decides
    room.contexts[1] = _line_context(backend, holding=True)
    backend.load.scraped_at = 1e12
    assert len(room.plan("m")) == 9


def test_a_line_answer_reports_the_usage_the_shape_learns_from() -> None:
    from gateway.batch.lines import _usage_of

    assert _usage_of({"usage": {"prompt_tokens": 900, "completion_tokens": 180}}) == (900, 180)
    assert _usage_of({"usage": {"prompt_tokens": 900}}) == (900, 0)  # embeddings
    assert _usage_of({"choices": []}) is None
    assert _usage_of({"usage": {"prompt_tokens": "many"}}) is None


CLASSES = OnlineLimits(
    ttft_s=0.8, tpot_s=0.06, max_kv=0.9, class_tpot_s={"chat": 0.06, "default": 0.1, "long": None}
)


def test_classes_with_tpot_headroom_let_batch_lines_slow_them_within_their_slo() -> None:
    backend = _backend(H100, running=6, kv=0.30, ttft=0.1, tpot=0.015)
    limits = HeadroomLimits(kv_reserve=0.2, slo_margin=0.75, ramp_lines=100, max_online_slowdown=0.02)
    # chat: 0.75 x 60 ms over 15 ms predicted = 3x, so 200% slowdown allowed; default: 0.75 x 100 / 15
    assert allowed_slowdown(backend, {"chat": 3}, CLASSES, limits) == pytest.approx(2.0)
    assert allowed_slowdown(backend, {"chat": 3, "default": 1}, CLASSES, limits) == pytest.approx(2.0)
    flat = assess(backend, BatchLoad(lines=2, online=4, line_cost=0.02), CLASSES, 0, limits)
    assert flat.cap == 1 and flat.free == 0  # no per-class counts: 2% / 2% per line, as before
    by_class = BatchLoad(lines=2, online=4, line_cost=0.02, online_classes={"chat": 4})
    room = assess(backend, by_class, CLASSES, 0, limits)
    assert room.cap > 2 and room.free == room.cap - 2  # now KV and TPOT room decide, not the 2%
    assert room.cap == min(new_lines(backend, CLASSES, limits) + 2, math.floor(2.0 / 0.02))


def test_a_class_without_a_tpot_slo_or_near_it_keeps_the_flat_cap() -> None:
    backend = _backend(MI300X, running=6, kv=0.30, ttft=0.1, tpot=0.015)
    limits = HeadroomLimits(slo_margin=0.75, max_online_slowdown=0.02)
    assert allowed_slowdown(backend, {"chat": 2, "long": 1}, CLASSES, limits) == 0.02
    assert allowed_slowdown(backend, {"unknown": 1}, CLASSES, limits) == 0.02
    assert allowed_slowdown(backend, {}, CLASSES, limits) == 0.02
    near = _backend(MI300X, running=6, kv=0.30, ttft=0.1, tpot=0.046)  # past 0.75 x 60 ms
    assert allowed_slowdown(near, {"chat": 2}, CLASSES, limits) == 0.02


def test_requests_hold_and_release_their_backends_count_by_class() -> None:
    from gateway.request.context import RequestContext

    backend = _backend(H100)
    contexts = []
    for cls, tokens in (("chat", 300), ("chat", 500), ("batch", 2_000)):
        ctx = RequestContext(endpoint="chat", caller=SimpleNamespace())  # type: ignore[arg-type]
        ctx.decision = SimpleNamespace(request_class=cls)  # type: ignore[assignment]
        ctx.profile = SimpleNamespace(n=1, prompt_tokens_estimate=tokens)  # type: ignore[assignment]
        ctx.hold(backend)
        contexts.append(ctx)
    assert backend.inflight == 3 and backend.inflight_by_class == {"chat": 2, "batch": 1}
    assert backend.prompt_tokens_by_class == {"chat": 800, "batch": 2_000}
    contexts[0].release()
    contexts[0].release()  # once only
    contexts[2].release()
    assert backend.inflight == 1 and backend.inflight_by_class == {"chat": 1, "batch": 0}
    assert backend.prompt_tokens_by_class == {"chat": 500, "batch": 0}


def test_fleet_room_sees_online_classes_but_not_its_own_lines() -> None:
    backend = _backend(H100, running=6, kv=0.30, ttft=0.1, tpot=0.015, inflight=5)
    backend.inflight_by_class.update({"chat": 3, "batch": 2})
    catalog = SimpleNamespace(serving=lambda model: [backend])
    pipeline = SimpleNamespace(router=None, queued=0)
    room = FleetRoom(catalog, pipeline, LIMITS)  # type: ignore[arg-type]
    for line in range(2):
        room.started(backend)
        room.contexts[line] = _line_context(backend, holding=True)
    load = room._load(backend, room._held())
    assert (load.online, load.online_classes) == (3, {"chat": 3})
    backend.inflight_by_class["batch"] = 3  # one more: an online request of class batch
    backend.inflight = 6
    load = room._load(backend, room._held())
    assert (load.online, load.online_classes) == (4, {"chat": 3, "batch": 1})


# --- classes without a TPOT SLO, the idle ramp and the end of a batch -----------------------------------

TTFT_ONLY = OnlineLimits(
    ttft_s=0.8,
    tpot_s=0.06,
    max_kv=0.9,
    class_tpot_s={"chat": 0.06, "long": None, "bare": None},
    class_ttft_s={"chat": 0.8, "long": 3.0, "bare": None},
)


def test_a_class_with_only_a_ttft_slo_is_protected_by_its_ttft_headroom() -> None:
    # Long prompts on an MI300X: predicted TTFT 300 ms against 0.75 x 3 s: lines may slow it 6.5x over.
    backend = _backend(MI300X, running=20, kv=0.05, ttft=0.3, tpot=0.015)
    limits = HeadroomLimits(slo_margin=0.75, max_online_slowdown=0.02)
    assert allowed_slowdown(backend, {"long": 4}, TTFT_ONLY, limits) == pytest.approx(6.5)
    # With chat there too, the tighter of the two: 0.75 x 60 / 15 - 1 = 2.
    assert allowed_slowdown(backend, {"long": 4, "chat": 1}, TTFT_ONLY, limits) == pytest.approx(2.0)
    # A class with no SLO at all keeps the flat fraction, and so does one near its TTFT SLO.
    assert allowed_slowdown(backend, {"long": 4, "bare": 1}, TTFT_ONLY, limits) == 0.02
    near = _backend(MI300X, running=20, kv=0.05, ttft=2.3, tpot=0.015)
    assert allowed_slowdown(near, {"long": 4}, TTFT_ONLY, limits) == 0.02
    # So long prompts no longer hold a backend with lots of KV room to one line (2% / 1.9%).
    load = BatchLoad(lines=1, online=4, line_cost=0.019, online_classes={"long": 4})
    assert assess(backend, load, TTFT_ONLY, 0, LIMITS).cap == 48


def test_the_batch_route_protects_online_requests_of_its_class_but_sets_no_limit_of_its_own() -> None:
    routes = {
        "chat": _route(prefer={"vendor": "nvidia"}, slo={"ttft_ms": 800, "tpot_ms": 60}),
        "long": _route(prefer={"accelerator": "mi300x"}, slo={"ttft_ms": 3000}),
        "batch": _route(
            prefer={"accelerator": "mi300x"}, slo={"tpot_ms": 100}, saturation={"max_kv_cache_usage": 0.5}
        ),
    }
    amd = online_limits(routes, _backend(MI300X), lowest="batch")
    assert (amd.ttft_s, amd.tpot_s, amd.max_kv) == (3.0, None, 0.95)
    assert amd.class_tpot_s == {"long": None, "batch": 0.1}
    assert amd.class_ttft_s == {"long": 3.0, "batch": None}
    backend = _backend(MI300X, running=20, kv=0.05, ttft=0.3, tpot=0.015)
    limits = HeadroomLimits(slo_margin=0.75, max_online_slowdown=0.02)
    # A client's own unstreamed jobs (class batch): 0.75 x 100 ms over 15 ms, less 1.
    assert allowed_slowdown(backend, {"batch": 3}, amd, limits) == pytest.approx(4.0)


def test_an_idle_backend_ramps_as_fast_as_it_prefills_within_the_ttft_headroom() -> None:
    backend = _backend(H100, running=1, kv=0.001, ttft=0.1, tpot=0.01)
    # Two H100s prefill 2 x 17,700 x 2.2 tokens/s; 0.75 x 800 ms - 100 ms = 0.5 s of it is 38,940
    # tokens: 38 lines of 1000 prompt tokens at once, 19 of 2000.
    idle = assess(backend, BatchLoad(lines=0, settled=0), ONLINE, 0, RAMPED)
    assert (idle.cap, idle.free) == (38, 38)
    long = assess(backend, BatchLoad(settled=0, prompt_tokens=2000), ONLINE, 0, RAMPED)
    assert long.free == 19
    # Online requests on it: two new lines per scrape, as before.
    busy = assess(backend, BatchLoad(settled=0, online=1), ONLINE, 0, RAMPED)
    assert busy.free == 2
    # No TTFT headroom left: the ramp never falls under ramp_lines; no TTFT SLO here: the ceiling.
    slow = _backend(H100, running=1, kv=0.001, ttft=0.59, tpot=0.01)
    assert assess(slow, BatchLoad(settled=0), ONLINE, 0, RAMPED).free == 2
    assert assess(backend, BatchLoad(settled=0), OnlineLimits(max_kv=0.9), 0, RAMPED).free == 48


def test_the_last_lines_spread_over_every_backend_with_room() -> None:
    cheap = _backend(MI300X, cost=1.0, name="cheap")
    dear = _backend(H100, cost=4.0, name="dear")
    rooms = [
        Room(dear, cap=2, free=2, cost_per_mtok=4.0),
        Room(cheap, cap=4, free=4, cost_per_mtok=1.0),
    ]
    # Cheapest first in each turn, one slot of each backend per turn: 3 lines go cheap, dear, cheap.
    assert [b.name for b in picks(rooms)] == ["cheap", "dear", "cheap", "dear", "cheap", "cheap"]
    assert picks([Room(dear, cap=0, free=0, cost_per_mtok=4.0)]) == []
