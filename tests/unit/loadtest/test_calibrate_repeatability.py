"""The real server against itself (loadtest/calibrate/repeatability.py) and the sweep's warm-up
(loadtest/calibrate/warmup.py)."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import pytest

from backends.lifetime import stop_process
from loadtest.calibrate.check import WIDTHS, LevelRun, held_apart_jobs
from loadtest.calibrate.legs import start_simulator
from loadtest.calibrate.measure import Server, Timed
from loadtest.calibrate.repeatability import attainment, fresh_tokens, main, repeat
from loadtest.calibrate.warmup import (
    MAX_REQUESTS,
    SETTLE_BURST,
    lengths,
    longest_prompt,
    settle,
    warm_up,
)
from tests.support import free_port

VOCABULARY = list(range(100, 4000))


def _run(ttfts: list[float], tpot: float) -> LevelRun:
    return LevelRun([Timed(10, 8, 0.0, ttft, tpot, 0.0) for ttft in ttfts], 0.0, 0.0)


def test_fresh_tokens_keep_every_size_and_class_but_not_the_tokens() -> None:
    levels = held_apart_jobs(VOCABULARY, 512, seed=3)
    again = fresh_tokens(levels, VOCABULARY, random.Random(4))
    for jobs, jobs_again in zip(levels, again, strict=True):
        assert [(len(j.prompt), j.output_tokens, j.request_class) for j in jobs] == [
            (len(j.prompt), j.output_tokens, j.request_class) for j in jobs_again
        ]
        # a repeated prefix would be served from the prefix cache: no prompt starts as its twin does
        assert all(a.prompt[:16] != b.prompt[:16] for a, b in zip(jobs, jobs_again, strict=True))
        assert all(token in VOCABULARY for job in jobs_again for token in job.prompt)


def test_attainment_counts_both_legs_against_the_reference_legs_own_percentiles() -> None:
    reference = [_run([i / 1000 for i in range(1, 101)], 0.005)]
    same = [_run([i / 1000 for i in range(1, 101)], 0.005)]
    mine, theirs = attainment(reference, same, 80)
    assert mine == theirs == 0.80  # within the 80th percentile of TTFT (80.2 ms): 1 .. 80 ms
    slower = [_run([i / 1000 for i in range(1, 101)], 0.0051)]  # every token 2 % slower
    assert attainment(reference, slower, 80) == (0.80, 0.0)  # one bound crossed by a little: all miss


def test_a_repeat_reports_the_larger_gap_either_way_at_each_percentile() -> None:
    first = [_run([0.010 + i / 10000 for i in range(50)], 0.004) for _ in WIDTHS]
    second = [_run([0.012 + i / 10000 for i in range(50)], 0.004) for _ in WIDTHS]  # TTFT 2 ms later
    result = repeat(first, second)
    assert [row.level for row in result.rows if row.asserted] == [f"x{w}" for w in WIDTHS for _ in range(3)]
    # by the first leg's 80th percentile (13.92 ms) the first meets 80 %, the second 40 %; by the
    # second's (15.92 ms) the second meets 80 % and the first all: 40 and 20 points, the larger counts
    assert abs(result.gaps[80] - 40.0) < 1e-9
    assert set(result.gaps) == {80, 90, 95, 98}
    assert repeat(first, first).gaps == dict.fromkeys((80, 90, 95, 98), 0.0)


def test_warm_up_lengths_cover_every_size_or_a_stride_of_a_long_context() -> None:
    assert list(lengths(488)) == list(range(1, 489))
    long = lengths(8192 - 24)
    assert len(long) <= MAX_REQUESTS and long.step == 16 and long[0] == 1
    assert longest_prompt(512) == 488 and longest_prompt(10) == 8


class _Server(Server):
    """A server that only records what it was sent (the warm-up's own logic is what is under test)."""

    def __init__(self, seconds: float = 0.0) -> None:
        super().__init__("http://unused", "m")
        self.vocabulary = VOCABULARY
        self.sent: list[tuple[int, int]] = []
        self.seconds = seconds

    async def complete(self, prompt: list[int], output_tokens: int) -> Timed:
        self.sent.append((len(prompt), output_tokens))
        await asyncio.sleep(self.seconds)
        return Timed(len(prompt), output_tokens, 0.0, 0.0, None, 0.0)


def test_warm_up_sends_every_length_once_with_one_token_out() -> None:
    async def run() -> _Server:
        server = _Server()
        try:
            assert await warm_up(server, 40, random.Random(1), time.monotonic() + 60) == 40
        finally:
            await server.close()
        return server

    assert asyncio.run(run()).sent == [(n, 1) for n in range(1, 41)]


def test_warm_up_stops_at_its_deadline() -> None:
    async def run() -> int:
        server = _Server(seconds=0.02)
        try:
            return await warm_up(server, 400, random.Random(1), time.monotonic() + 0.1)
        finally:
            await server.close()

    assert 2 <= asyncio.run(run()) <= 7


class _Settling(_Server):
    """A server whose stream decodes at `slow` for its first `slow_requests` requests, then at `fast`."""

    def __init__(self, slow_requests: int, slow: float = 0.0013, fast: float = 0.00095) -> None:
        super().__init__(seconds=0.0)
        self.slow_requests, self.slow, self.fast = slow_requests, slow, fast

    async def complete(self, prompt: list[int], output_tokens: int) -> Timed:
        await super().complete(prompt, output_tokens)
        tpot = self.slow if len(self.sent) <= self.slow_requests else self.fast
        return Timed(len(prompt), output_tokens, 0.0, 0.003, tpot, 0.0)


def _settle(server: _Settling, deadline_s: float, min_s: float) -> list[float]:
    async def run() -> list[float]:
        try:
            return await settle(server, 61, 32, random.Random(1), time.monotonic() + deadline_s, min_s)
        finally:
            await server.close()

    return asyncio.run(run())


def test_settle_decodes_past_a_slow_plateau_until_three_bursts_agree() -> None:
    # five bursts at a flat 1.3 ms agree with each other, but inside the least time the settling takes
    server = _Settling(slow_requests=5 * SETTLE_BURST)
    medians = _settle(server, deadline_s=30, min_s=0.2)
    assert medians[:5] == [0.0013] * 5 and medians[-3:] == [0.00095] * 3
    assert all(sent == (61, 32) for sent in server.sent)
    assert len(server.sent) == len(medians) * SETTLE_BURST


def test_settle_stops_at_its_deadline_on_a_server_that_never_settles() -> None:
    server = _Settling(slow_requests=10**9)
    started = time.monotonic()
    medians = _settle(server, deadline_s=0.15, min_s=10)
    assert time.monotonic() - started < 1.0
    assert medians and set(medians) == {0.0013}


def test_runs_must_be_one_or_more() -> None:
    for bad in ("0", "-2", "many"):
        with pytest.raises(SystemExit) as exited:
            main(["--url", "http://127.0.0.1:9", "--model", "m", "--runs", bad])
        assert exited.value.code == 2


def test_a_server_that_cannot_be_measured_is_named_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    assert main(["--url", nobody, "--model", "m", "--runs", "1"]) == 2
    assert f"repeatability: {nobody}: ConnectError" in capsys.readouterr().err
    # a simulator answers /v1/models and /metrics but has no /tokenize: no vLLM server to measure
    process, url = start_simulator(
        ["--gpu", "h100", "--model-profile", "llama-3.1-8b"], "m", 512, tmp_path / "sim.log"
    )
    try:
        assert main(["--url", url, "--model", "m", "--runs", "1"]) == 2
    finally:
        stop_process(process)
    err = capsys.readouterr().err
    assert f"repeatability: {url}: ServerError" in err and "/tokenize answered 404" in err
