"""A calibrated server's front end (backends/sim/frontend.py): the requests it holds share it. In the
simulator it starts when the request reached the server, not when the simulator's own handler got round
to it: reading and parsing the request is part of the modelled front-end time (backends/sim/engine.py),
so the simulator does not add its own HTTP time on top of the server's."""

from __future__ import annotations

import asyncio
import time

import pytest

from backends.calibrated import dump_profile, parse_profile
from backends.sim.engine import BatchEngine, SimClock
from backends.sim.frontend import FrontEnd
from backends.sim.metrics import EngineStats
from backends.sim.profiles import calibrated_hardware
from backends.sim.protocol import GenerationRequest
from backends.sim.text import Generation
from tests.unit.backends.test_calibrated import MODEL, profile

FRONT_END_S = 0.05


def test_requests_held_together_share_it_and_a_later_one_slows_them_down() -> None:
    front: FrontEnd[str] = FrontEnd()
    assert front.enter(0.0, 0.010, "a") == [("a", pytest.approx(0.010))]  # alone: its own time
    # b at 4 ms: a has 6 ms of work left, b 10; shared, a leaves at 4 + 12, b 4 ms of work later
    leaving = front.enter(0.004, 0.010, "b")
    assert leaving == [("a", pytest.approx(0.016)), ("b", pytest.approx(0.020))]
    # c at 20 ms, after both have left: alone again
    assert front.enter(0.020, 0.003, "c") == [("c", pytest.approx(0.023))]
    assert len(front) == 1


def test_a_cohort_leaves_together_where_one_at_a_time_would_space_it_out() -> None:
    front: FrontEnd[int] = FrontEnd()
    for i in range(4):
        leaving = front.enter(0.0, 0.0025, i)
    assert [leaves for _, leaves in leaving] == pytest.approx([0.010] * 4)
    front.enter(0.012, 0.001, 9)  # after they all left
    assert len(front) == 1


def test_a_request_that_needs_no_time_passes_and_one_that_goes_away_frees_its_share() -> None:
    front: FrontEnd[str] = FrontEnd()
    front.enter(0.0, 0.010, "a")
    front.enter(0.0, 0.010, "b")
    assert front.enter(0.001, 0.0, "free") == [
        ("a", pytest.approx(0.020)),
        ("b", pytest.approx(0.020)),
        ("free", 0.001),
    ]
    # b goes at 1 ms, when each had 9.5 ms of its work left: a has the front end to itself from then
    assert front.drop("b") == [("a", pytest.approx(0.0105))]
    assert front.drop("unknown") == [("a", pytest.approx(0.0105))]


def test_an_arrival_stamped_before_the_last_one_is_taken_as_arriving_with_it() -> None:
    front: FrontEnd[str] = FrontEnd()
    front.enter(0.005, 0.010, "a")
    assert front.enter(0.004, 0.010, "b") == [("a", pytest.approx(0.025)), ("b", pytest.approx(0.025))]


async def test_the_simulator_hands_a_cohort_over_together_and_reschedules_as_requests_arrive() -> None:
    engine, clock = _engine()
    try:
        runs = [engine.submit(_request(), [Generation(["a"] * 4, "length")]) for _ in range(3)]
        arrivals = [run._group.arrival for run in runs]  # type: ignore[attr-defined]
        assert max(arrivals) - min(arrivals) < 0.002  # all at about 3 x 50 ms
        assert min(arrivals) - clock.now() == pytest.approx(3 * FRONT_END_S, abs=0.005)
        runs[0].close()  # one goes away: the other two share the front end from then on
        arrivals = [run._group.arrival for run in runs[1:]]  # type: ignore[attr-defined]
        assert min(arrivals) - clock.now() == pytest.approx(2 * FRONT_END_S, abs=0.005)
        await asyncio.wait_for(asyncio.gather(*(run.finish() for run in runs[1:])), 2.0)
    finally:
        await engine.close()


def _request() -> GenerationRequest:
    return GenerationRequest(
        kind="completion",
        model=MODEL,
        prompt_key="p",
        prompt_tokens=32,
        n=1,
        max_tokens=4,
        sampling_key=None,
        stream=True,
        include_usage=False,
    )


def _engine(**step: float) -> tuple[BatchEngine, SimClock]:
    """An engine of a profile whose front end takes `FRONT_END_S` (and `step`'s other terms)."""
    clock = SimClock()
    hardware = calibrated_hardware(profile(request_s=FRONT_END_S, **step))
    return BatchEngine(hardware, EngineStats(model_name=MODEL, kv_capacity_tokens=0), clock), clock


def _leaves(engine: BatchEngine, received: float | None) -> float:
    run = engine.submit(_request(), [Generation(["a"] * 4, "length")], received)
    arrival: float = run._group.arrival  # type: ignore[attr-defined]
    run.close()
    return arrival


async def _leaves_after(handled_for: float | None) -> tuple[float, float, float]:
    """(when the request leaves the front end, when it reached the server, now), on a fresh engine that
    has been up a while; `handled_for`: how long ago the request reached it (None: not said)."""
    engine, clock = _engine()
    try:
        await asyncio.sleep(0.1)
        received = None if handled_for is None else time.monotonic() - handled_for
        now = clock.now()
        came = now if received is None else clock.at(received)
        return _leaves(engine, received), came, now
    finally:
        await engine.close()


async def test_the_front_end_counts_from_when_the_request_reached_the_server() -> None:
    leaves, came, now = await _leaves_after(None)
    assert leaves == pytest.approx(now + FRONT_END_S, abs=0.005)
    leaves, came, now = await _leaves_after(0.03)  # its handler took 30 ms to read and parse it
    assert leaves == pytest.approx(came + FRONT_END_S, abs=0.002)
    assert leaves - now == pytest.approx(FRONT_END_S - 0.03, abs=0.005)
    leaves, came, now = await _leaves_after(2 * FRONT_END_S)  # slower than the front end: no further wait
    assert leaves <= now


async def test_a_received_time_from_the_future_is_read_as_now() -> None:
    engine, clock = _engine()
    try:
        now = clock.now()
        assert _leaves(engine, time.monotonic() + 10) == pytest.approx(now + FRONT_END_S, abs=0.005)
    finally:
        await engine.close()


async def test_the_clock_learns_how_late_its_loop_wakes_and_aims_that_much_early(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loop that wakes every timer 0.8 ms late (asyncio rounds a wait up to the next millisecond): the
    clock comes to aim about 0.8 ms early, so steps end when the model says; never more than 2 ms."""
    import backends.sim.engine as engine_module

    real = [100.0]

    async def late_sleep(seconds: float) -> None:
        real[0] += seconds + 0.0008

    monkeypatch.setattr(engine_module.time, "monotonic", lambda: real[0])
    monkeypatch.setattr(engine_module.asyncio, "sleep", late_sleep)
    clock = SimClock()
    misses = []
    for step in range(1, 80):
        when = step * 0.003
        await clock.sleep_until(when)
        misses.append(clock.now() - when)
    assert misses[0] == pytest.approx(0.0008)
    assert abs(misses[-1]) < 0.0001
    assert clock.early == pytest.approx(0.0008, abs=0.0001)

    async def early_sleep(seconds: float) -> None:  # uvloop rounds down instead: woken early
        real[0] += max(0.0, seconds - 0.005)

    monkeypatch.setattr(engine_module.asyncio, "sleep", early_sleep)
    for step in range(80, 160):
        await clock.sleep_until(step * 0.003)
    assert clock.early == 0.0  # never aims late on purpose


async def test_the_clients_own_round_trip_is_not_held_again() -> None:
    """A profile whose front end held 20 ms of the client's own round trip (`http_s`): the simulator,
    whose client pays its own round trip, holds the request 20 ms less; never before it arrived."""
    engine, clock = _engine(http_s=0.02)
    try:
        await asyncio.sleep(0.1)
        now = clock.now()
        assert _leaves(engine, None) == pytest.approx(now + FRONT_END_S - 0.02, abs=0.005)
    finally:
        await engine.close()
    engine, clock = _engine(http_s=1.0)  # more than the whole front end
    try:
        await asyncio.sleep(0.1)
        now = clock.now()
        assert now - 0.005 <= _leaves(engine, None) <= now + 0.005
    finally:
        await engine.close()


def test_a_profile_keeps_its_round_trip_and_one_without_is_written_as_before() -> None:
    text = dump_profile(profile(http_s=0.0017))
    assert "http_s: 0.0017" in text
    assert parse_profile(text).step.http_s == 0.0017
    assert "http_s" not in dump_profile(profile())
