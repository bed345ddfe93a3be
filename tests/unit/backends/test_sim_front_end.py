"""A calibrated simulator's front end starts when the request reached the server, not when the simulator's
own handler got round to it: reading and parsing the request is part of the modelled front-end time
(backends/sim/engine.py), so the simulator does not add its own HTTP time on top of the server's."""

from __future__ import annotations

import asyncio
import statistics
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


def _times(front: FrontEnd, count: int = 4000) -> list[float]:
    """What each of `count` requests, sent far apart, spent in it."""
    return [front.leave(i * 10.0, 0.002) - i * 10.0 for i in range(count)]


def test_a_front_end_without_spread_takes_its_mean_and_one_with_it_keeps_the_mean() -> None:
    assert _times(FrontEnd(), 5) == pytest.approx([0.002] * 5)
    spread = _times(FrontEnd(cv=1.0, seed=3))
    assert statistics.fmean(spread) == pytest.approx(0.002, rel=0.05)
    assert statistics.pstdev(spread) / statistics.fmean(spread) == pytest.approx(1.0, abs=0.08)
    narrow = _times(FrontEnd(cv=0.3, seed=3))
    assert statistics.pstdev(narrow) / statistics.fmean(narrow) == pytest.approx(0.3, abs=0.03)
    assert _times(FrontEnd(cv=1.0, seed=3)) == spread  # a replay gives the same answer every time
    assert _times(FrontEnd(cv=1.0, seed=4)) != spread  # another backend, another draw


def test_requests_sent_together_still_leave_one_after_the_other() -> None:
    front = FrontEnd(cv=1.0, seed=1)
    leaves = [front.leave(0.0, 0.002) for _ in range(50)]
    assert leaves == sorted(leaves) and len(set(leaves)) == 50
    assert leaves[-1] == pytest.approx(50 * 0.002, rel=0.35)


def test_a_profile_keeps_its_spread_and_one_without_is_written_as_before() -> None:
    text = dump_profile(profile(request_cv=1.0))
    assert "request_cv: 1.0" in text and parse_profile(text).step.request_cv == 1.0
    assert "request_cv" not in dump_profile(profile())


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
