"""Calibrated from a real backend: measure one vLLM server, fit its profile, prove the simulator predicts it.

This module starts its own real vLLM CPU server of the tiny model, with the engine core in its own process
(`VLLM_ENABLE_V1_MULTIPROCESSING=1`, vLLM's normal mode: the session's servers run it in the HTTP
process, whose front end then streams tokens in bursts). `switchyard calibrate` sweeps it and writes a
profile; then a held-apart load (another seed, prompt lengths over the whole context, concurrency 3, 6
and 12, which the sweep never used) runs through a gateway with its access log on, and the same requests
run on a simulator started from the profile. Per level the servers' own mean TTFT and inter-token latency
must agree within 20 %, and the what-if replay of the gateway's access log on the profile must agree with
the run's SLO attainment within 5 points per class. The built-in MI300X profile (an 8B model on a GPU)
must fail the same comparison, so the test can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from backends.calibrated import load_profile
from backends.launcher import LaunchSpec, build_launch, start, stop, wait_ready
from backends.sim.fleet_spec import FleetSpec, GroupSpec, ProfileSpec
from gateway.cli import main as switchyard
from loadtest.calibrate.agreement import (
    ClassSlo,
    calibrated_fleet,
    logged_attainment,
    replayed_attainment,
)
from loadtest.calibrate.check import (
    TOLERANCE,
    WIDTHS,
    Target,
    calibrated_timing,
    compare,
    failures,
    format_rows,
    held_apart_jobs,
    percentile,
    run_interleaved,
    start_simulator,
    stop_process,
    vocabulary_of,
)
from loadtest.calibrate.speed import SpeedGate, calibration_speed, kept_log
from tests.support import free_port, metric, running_gateway, sim_metrics
from tests.vllm.conftest import MAX_MODEL_LEN, MODEL, READY_TIMEOUT, _model, _python

POOL = "calibrated"
WRONG = ["--gpu", "mi300x", "--model-profile", "llama-3.1-8b"]
"""The built-in MI300X datasheet profile serving an 8B model: what a fresh install assumes."""
ATTAINMENT_POINTS = 0.05
SCRAPE_S = 1.0
"""The gateways' /metrics scrape interval (their default), and the replay's."""
SEED = 20261127


def _policy(path: Path) -> Path:
    """Two classes, named by each request's `x-switchyard-class` (their rules never match on their own)."""
    path.write_text(
        "name: calibrate-check\n"
        "classes:\n"
        "  - name: chat\n    when: {n: {gt: 16}}\n"
        "  - name: bulk\n    when: {n: {gt: 16}}\n"
        "routes:\n"
        "  chat: {strategy: {least-outstanding: 1}}\n"
        "  bulk: {strategy: {least-outstanding: 1}}\n"
        "  default: {strategy: {least-outstanding: 1}}\n"
    )
    return path


def _slos_from(log: Path) -> dict[str, ClassSlo]:
    """Per class, bounds at the real run's own 80th percentiles of TTFT and time per output token, so
    about a fifth of each class misses and a replay that is off in either direction shows it."""
    from loadtest.whatif.accesslog import read_log

    ttfts: dict[str, list[float]] = {}
    tpots: dict[str, list[float]] = {}
    for request in read_log(log).requests:
        line = request.line
        if line.ttft_s is None or not line.duration_s or line.completion_tokens < 2:
            continue
        ttfts.setdefault(line.request_class, []).append(line.ttft_s)
        tpots.setdefault(line.request_class, []).append(
            (line.duration_s - line.ttft_s) / (line.completion_tokens - 1)
        )
    return {
        cls: ClassSlo(percentile(ttfts[cls], 80) or 0.0, percentile(tpots[cls], 80) or 0.0) for cls in ttfts
    }


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
            env={"VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
        )
    )
    process = start(launch, log)
    try:
        wait_ready(launch.url, process, log, READY_TIMEOUT)
        yield launch.url
    finally:
        stop(process)


def _gateway_config(url: str, policy: Path, log: Path | None) -> dict[str, Any]:
    """One pool of one backend, the gateway's default scrape interval; `log`: its access log."""
    telemetry = {"access_log": {"destination": str(log)}} if log is not None else {}
    return {
        "gateway": {"timeouts": {"first_byte": 120.0}, "scrape": {"interval": SCRAPE_S, "timeout": 1.0}},
        "policy": {"file": str(policy)},
        "telemetry": telemetry,
        "pools": [
            {
                "name": POOL,
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [{"name": "b-0", "url": url, "models": [MODEL], "max_model_len": MAX_MODEL_LEN}],
            }
        ],
    }


def test_calibrated_profile_predicts_the_real_server(real_server: str, tmp_path: Path) -> None:
    profile_path = tmp_path / "tiny.yaml"
    argv = ["calibrate", "--url", real_server, "--model", MODEL, "--accelerator", "cpu"]
    code = switchyard([*argv, "--budget", "60s", "--max-concurrency", "16", "--out", str(profile_path)])
    assert code == 0
    profile = load_profile(profile_path)
    info = sim_metrics(real_server)
    assert profile.limits.max_model_len == MAX_MODEL_LEN
    assert metric(info, "vllm:cache_config_info", block_size=str(profile.limits.block_size)) == 1
    assert metric(info, "vllm:cache_config_info", num_gpu_blocks=str(profile.limits.num_blocks)) == 1
    assert profile.step.per_prefill_token_s > 0 and profile.points

    vocabulary, max_model_len = asyncio.run(vocabulary_of(real_server, MODEL))
    levels = held_apart_jobs(vocabulary, max_model_len, SEED)
    gateway_log = tmp_path / "access.jsonl"
    policy = _policy(tmp_path / "policy.yaml")
    # The same load through a gateway each: the real server, the simulator of the fitted profile and
    # that of the built-in MI300X profile, level by level (loadtest/calibrate/check.py).
    with contextlib.ExitStack() as stack:
        urls = [real_server]
        for name, timing in (("calibrated", calibrated_timing(profile_path)), ("wrong", WRONG)):
            process, url = start_simulator(timing, MODEL, max_model_len, tmp_path / f"{name}.log")
            stack.callback(stop_process, process)
            urls.append(url)
        targets = [
            Target(
                stack.enter_context(
                    running_gateway(
                        _gateway_config(url, policy, gateway_log if i == 0 else None), tmp_path / f"gw{i}"
                    )
                ),
                url,
            )
            for i, url in enumerate(urls)
        ]
        baseline = calibration_speed(profile)
        assert baseline is not None, "the sweep measured no level of one request at a time"
        gate = SpeedGate(real_server, MODEL, baseline, vocabulary, seed=SEED)
        real, simulated, wrong_run = asyncio.run(run_interleaved(targets, MODEL, levels, WIDTHS, gate))
    print(f"\n{gate.describe()}")
    log = kept_log(gateway_log, gate, tmp_path / "access-kept.jsonl")

    calibrated = compare(real, simulated, WIDTHS)
    wrong = compare(real, wrong_run, WIDTHS)
    print(f"\ncalibrated profile ({profile_path}):\n{format_rows(calibrated)}")
    print(f"\nbuilt-in MI300X profile:\n{format_rows(wrong)}")

    slos = _slos_from(log)
    real_shares = logged_attainment(log, slos)
    replayed = replayed_attainment(
        log, calibrated_fleet(profile_path, MODEL, MAX_MODEL_LEN, POOL), policy, slos, SCRAPE_S
    )
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

    assert not failures(calibrated), f"the calibrated profile is off by more than {TOLERANCE:.0%}"
    assert failures(wrong), "the built-in MI300X profile passed: the comparison cannot tell profiles apart"
    for cls, share in real_shares.items():
        assert abs(replayed[cls] - share) <= ATTAINMENT_POINTS, f"class {cls}: replay {replayed[cls]:.1%}"
    assert any(abs(wrong_replayed[c] - s) > ATTAINMENT_POINTS for c, s in real_shares.items())
