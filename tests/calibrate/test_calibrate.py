"""Calibrated from a real backend: measure one vLLM server, fit its profile, prove the simulator predicts it.

This module starts its own real vLLM CPU server of the tiny model (or uses the one at
SWITCHYARD_CALIBRATE_URL), started as the launcher starts a CPU server, below its clients and with its
compute on a core of its own (backends/cpu_priority.py). `switchyard calibrate`'s sweep measures it
through the gateway the real leg uses (the hop on the core it shares with the server) and fits a profile;
a held-apart load (another seed, prompt lengths over the whole context, concurrency 3, 6 and 12,
which the sweep never used) runs on it through a gateway with its access log on, a third of each level
after each phase of the sweep, so both see the same minutes of the machine (the fit never sees the
held-apart levels), and after each piece a quiet (check.quiet_after), so the access log's pieces stay as
far apart in a replay as they were in the run. Then the same load, in the same pieces, runs through a
gateway each to a simulator started from the profile and to one started from the built-in MI300X
profile. Per level the client's TTFT p50 and p90 and time per output token p50 must agree within 20 %,
and the what-if replay of the real gateway's access log on the profile must agree with the run's SLO
attainment within 5 points per class.
The built-in MI300X profile (an 8B model on a GPU) must fail the same comparison, so the test can fail.
Before the check and after its loads each core is timed alone (core_speed), and a failure says whether
the machine held one speed: on a core that changes speed on its own, no profile of the server can hold.

With SWITCHYARD_CALIBRATE_RECORD=DIR it records the real measurements (the sweep, the held-apart load and
its real run, the access log, the policy) to DIR before comparing anything, and
`python -m loadtest.calibrate.offline DIR` re-runs the fit, the simulated legs and the replay from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.calibrated import CalibratedProfile, dump_profile, load_profile
from backends.cpu_priority import compute_apart, on_clients_core
from backends.launcher import LaunchSpec, build_launch
from backends.lifetime import stop_process
from backends.server_process import start, stop, wait_ready
from backends.sim.fleet_spec import FleetSpec, GroupSpec, ProfileSpec
from loadtest.calibrate import core_speed
from loadtest.calibrate.agreement import (
    ATTAINMENT_POINTS,
    calibrated_fleet,
    logged_attainment,
    off_by_more,
    replayed_attainment,
    slos_from_log,
)
from loadtest.calibrate.check import (
    PIECES,
    TOLERANCE,
    WIDTHS,
    Job,
    LevelRun,
    Target,
    bursts,
    compare,
    failures,
    format_rows,
    held_apart_jobs,
    merged,
    pieces,
    quiet_after,
    run_interleaved,
    run_level,
    vocabulary_of,
)
from loadtest.calibrate.gap import format_parts, replayed_with_parts
from loadtest.calibrate.legs import (
    POOL,
    SCRAPE_S,
    WRONG,
    calibrated_timing,
    gateway_config,
    held_apart_only,
    running_gateway,
    start_simulator,
    write_policy,
)
from loadtest.calibrate.machine import BusyMeter
from loadtest.calibrate.measure import stream_client
from loadtest.calibrate.options import Options
from loadtest.calibrate.recording import Recording, save
from loadtest.calibrate.sweep import Calibration
from tests.support import free_port, metric, sim_metrics
from tests.vllm.conftest import MAX_MODEL_LEN, MODEL, READY_TIMEOUT, _model, _python

SEED = 20261127
MACHINE_S = 15
"""How long the machine's cores are timed alone, before the check and after it (core_speed)."""
BUDGET_S = 120.0
"""The sweep's budget. At 60 s a machine whose single stream decodes at 4.3 ms a token cut the warm-up
at 376 of 488 prompt lengths and the sweep before its last levels (the long prompt's newcomers among
streams, which tell the mixed step from the context's cost); a faster one ends the sweep in under 60 s."""


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if os.environ.get("SWITCHYARD_CALIBRATE_URL"):  # a server already running (nothing else may load it)
        yield os.environ["SWITCHYARD_CALIBRATE_URL"]
        return
    log = tmp_path_factory.mktemp("calibrate-vllm") / "vllm.log"
    launch = build_launch(
        LaunchSpec(
            vendor="cpu",
            model=_model(),
            served_model_name=[MODEL],
            python=_python(),
            port=free_port(),
            max_model_len=MAX_MODEL_LEN,
            env=compute_apart(),  # the clients keep the first core
        )
    )
    process = start(launch, log, below_clients=True)  # the client shares the CPUs (backends/cpu_priority.py)
    try:
        wait_ready(launch.url, process, log, READY_TIMEOUT)
        yield launch.url
    finally:
        stop(process)


async def _calibrate_around(
    real: Target, levels: list[list[Job]], meter: BusyMeter
) -> tuple[CalibratedProfile, list[LevelRun], Calibration]:
    """`switchyard calibrate`'s sweep of the real server, with one piece of each level of the held-apart
    load run (through the gateway) after each of its phases (check.pieces): the check's real run and the
    sweep share the same minutes of the machine, so a spell in which it ran slower lands on both. The fit
    never sees the held-apart levels. Returns the profile and the held-apart levels as measured; `meter`
    measures the machine's CPUs while the pieces run."""
    rounds = pieces(levels)
    measured: list[list[LevelRun]] = [[] for _ in levels]
    async with stream_client() as client:

        async def between() -> None:
            for index, jobs in rounds.pop(0) if rounds else []:
                with meter.measuring():
                    run = await run_level(client, real, MODEL, jobs, WIDTHS[index])
                measured[index].append(run)
                await asyncio.sleep(quiet_after(run))  # the log's pieces as apart as the run's

        options = Options(
            url=real.metrics_url,
            model=MODEL,
            accelerator="cpu",
            budget_s=BUDGET_S,
            max_concurrency=16,
            through=real.url,  # the hop the held-apart load pays, on the core it shares with the server
        )
        calibration = Calibration(options, print, between)
        profile = await calibration.run()
        while rounds:  # a budget that ended the sweep early leaves pieces to run
            await between()
    return profile, [merged(runs) for runs in measured], calibration


def _machine(when: str) -> list[core_speed.CoreSpeed]:
    """Each core timed alone for `MACHINE_S` seconds, with only the idle server beside it."""
    speeds = core_speed.measure(MACHINE_S)
    for line in core_speed.report(speeds, TOLERANCE):
        print(f"the machine {when}: {line}")
    return speeds


def test_calibrated_profile_predicts_the_real_server(real_server: str, tmp_path: Path) -> None:
    before = _machine("before the check")
    vocabulary, max_model_len = asyncio.run(vocabulary_of(real_server, MODEL))
    levels = held_apart_jobs(vocabulary, max_model_len, SEED)
    gateway_log = tmp_path / "access.jsonl"
    policy = write_policy(tmp_path / "policy.yaml")
    profile_path = tmp_path / "tiny.yaml"
    config = gateway_config(real_server, MODEL, MAX_MODEL_LEN, policy, gateway_log)
    real_busy, simulated_busy = BusyMeter(), BusyMeter()
    # the gateway and this client on the core the server's engine leaves them (backends/cpu_priority.py)
    with on_clients_core(), running_gateway(config, tmp_path / "gw-real") as base:
        fitted, real, calibration = asyncio.run(
            _calibrate_around(Target(base, real_server), levels, real_busy)
        )
    held_apart_only(gateway_log)  # the sweep's requests went through the same gateway
    if os.environ.get("SWITCHYARD_CALIBRATE_RECORD"):  # for `python -m loadtest.calibrate.offline DIR`
        assert calibration.geometry is not None
        recording = Recording(
            calibration.options,
            calibration.geometry,
            calibration.levels,
            SEED,
            list(WIDTHS),
            levels,
            real,
            list(os.getloadavg()),
            PIECES,
            {speed.cpu: list(speed.per_second) for speed in before},
        )
        save(recording, Path(os.environ["SWITCHYARD_CALIBRATE_RECORD"]), gateway_log, policy)
    profile_path.write_text(dump_profile(fitted))
    profile = load_profile(profile_path)
    info = sim_metrics(real_server)
    assert profile.limits.max_model_len == MAX_MODEL_LEN
    assert metric(info, "vllm:cache_config_info", block_size=str(profile.limits.block_size)) == 1
    assert metric(info, "vllm:cache_config_info", num_gpu_blocks=str(profile.limits.num_blocks)) == 1
    assert (profile.step.prefill or profile.step.per_prefill_token_s > 0) and profile.points

    # The same load through a gateway each to the simulator of the fitted profile and to that of the
    # built-in MI300X profile, level by level (loadtest/calibrate/check.py).
    with contextlib.ExitStack() as stack:
        targets = []
        for name, timing in (("calibrated", calibrated_timing(profile_path)), ("wrong", WRONG)):
            process, url = start_simulator(timing, MODEL, max_model_len, tmp_path / f"{name}.log")
            stack.callback(stop_process, process)
            config = gateway_config(url, MODEL, MAX_MODEL_LEN, policy, None)
            base = stack.enter_context(running_gateway(config, tmp_path / name))
            targets.append(Target(base, url))
        with simulated_busy.measuring():
            simulated, wrong_run = asyncio.run(run_interleaved(targets, MODEL, levels, WIDTHS))
    log = gateway_log
    after = _machine("after the check's loads")
    machine = (
        "every core held one speed before and after"
        if not core_speed.unsteady(before + after, TOLERANCE)
        else "a core of the machine changed speed by more than that on its own, before or after (above)"
    )

    calibrated = compare(real, simulated, WIDTHS)
    wrong = compare(real, wrong_run, WIDTHS)
    print(f"\ncalibrated profile ({profile_path}):\n{format_rows(calibrated)}")
    print(f"\nbuilt-in MI300X profile:\n{format_rows(wrong)}")
    for note in bursts(real, WIDTHS):
        print(f"note: {note}")
    # the real server's API process shares its core with the gateway and this client (machine.py)
    print(f"note: CPUs busy while the real pieces ran: {real_busy.describe()}; the simulated: "
          f"{simulated_busy.describe()}")  # fmt: skip
    print(f"load average {os.getloadavg()}")

    slos = slos_from_log(log)
    real_shares = logged_attainment(log, slos)
    fleet = calibrated_fleet(profile_path, MODEL, MAX_MODEL_LEN, POOL)
    replayed, departs = replayed_with_parts(log, fleet, policy, slos, SCRAPE_S)
    wrong_fleet = FleetSpec(
        model=MODEL,
        max_model_len=MAX_MODEL_LEN,
        groups=[
            GroupSpec(
                pool=POOL,
                vendor="amd",
                accelerator="mi300x",
                price_per_gpu_hour=1.0,
                profile=ProfileSpec(gpu="mi300x", model="llama-3.1-8b"),
            )
        ],
    )
    wrong_replayed = replayed_attainment(log, wrong_fleet, policy, slos, SCRAPE_S)
    print(
        "\nSLO attainment per class (real run / replay on the calibrated profile / on the built-in MI300X):"
    )
    for cls, share in real_shares.items():
        print(
            f"  {cls:6} {share:6.1%} {replayed.get(cls, 0.0):6.1%} {wrong_replayed.get(cls, 0.0):6.1%}"
            f"  (TTFT <= {slos[cls].ttft_s * 1000:.1f} ms, TPOT <= {slos[cls].tpot_s * 1000:.2f} ms)"
        )
    print(f"\nwhere it departs, real run / replay on the calibrated profile:\n{format_parts(departs)}")

    assert not failures(calibrated), f"the calibrated profile is off by more than {TOLERANCE:.0%}; {machine}"
    off = off_by_more(real_shares, replayed)
    assert not off, f"classes {off}: replay over {ATTAINMENT_POINTS:.0%} from the real attainment; {machine}"
    # the built-in MI300X profile must fail the same comparison: its rows or its attainment (at one pair of
    # bounds its too-fast TTFT and too-slow decode can cancel in the attainment: docs/calibrate.md)
    wrong_attainment = off_by_more(real_shares, wrong_replayed)
    assert failures(wrong) or wrong_attainment, "the built-in MI300X profile passed the same comparison"
