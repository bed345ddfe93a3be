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
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.calibrated import load_profile
from backends.launcher import LaunchSpec, build_launch, start, stop, wait_ready
from backends.sim.fleet_spec import FleetSpec, GroupSpec, ProfileSpec
from gateway.cli.main import main as switchyard
from loadtest.calibrate.agreement import (
    ClassSlo,
    calibrated_fleet,
    logged_attainment,
    replayed_attainment,
)
from loadtest.calibrate.check import (
    TOLERANCE,
    WIDTHS,
    calibrated_timing,
    compare,
    failures,
    format_rows,
    held_apart_jobs,
    percentile,
    run_load,
    simulated_run,
    vocabulary_of,
)
from tests.support import free_port, metric, running_gateway, sim_metrics
from tests.vllm.conftest import MAX_MODEL_LEN, MODEL, READY_TIMEOUT, _model, _python

POOL = "calibrated"
WRONG = ["--gpu", "mi300x", "--model-profile", "llama-3.1-8b"]
"""The built-in MI300X datasheet profile serving an 8B model: what a fresh install assumes."""
ATTAINMENT_POINTS = 0.05
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
    return {cls: ClassSlo(percentile(ttfts[cls], 0.8), percentile(tpots[cls], 0.8)) for cls in ttfts}


@pytest.fixture(scope="module")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
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
    log = tmp_path / "access.jsonl"
    policy = _policy(tmp_path / "policy.yaml")
    config = {
        "gateway": {"timeouts": {"first_byte": 120.0}, "scrape": {"interval": 0.2, "timeout": 1.0}},
        "policy": {"file": str(policy)},
        "telemetry": {"access_log": {"destination": str(log)}},
        "pools": [
            {
                "name": POOL,
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.0,
                "backends": [
                    {"name": "real-0", "url": real_server, "models": [MODEL], "max_model_len": MAX_MODEL_LEN}
                ],
            }
        ],
    }
    with running_gateway(config, tmp_path / "gateway") as base:
        real = asyncio.run(run_load(base, MODEL, levels, WIDTHS, metrics_url=real_server))

    calibrated = compare(
        real, simulated_run(calibrated_timing(profile_path), MODEL, levels, max_model_len, tmp_path), WIDTHS
    )
    wrong = compare(real, simulated_run(WRONG, MODEL, levels, max_model_len, tmp_path), WIDTHS)
    print(f"\ncalibrated profile ({profile_path}):\n{format_rows(calibrated)}")
    print(f"\nbuilt-in MI300X profile:\n{format_rows(wrong)}")

    slos = _slos_from(log)
    real_shares = logged_attainment(log, slos)
    replayed = replayed_attainment(
        log, calibrated_fleet(profile_path, MODEL, MAX_MODEL_LEN, POOL), policy, slos
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
    wrong_replayed = replayed_attainment(log, wrong_fleet, policy, slos)
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
