"""A calibration check's recording (loadtest/calibrate/recording.py) and the offline re-run from it
(loadtest/calibrate/offline.py): the fit sees the recorded sweep only, the held-apart load is replayed on
the simulator's scheduler and compared with the recorded real run."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from backends.calibrated import StepFit
from loadtest.calibrate.check import (
    QUIET_SHARE,
    Job,
    LevelRun,
    compare,
    failures,
    merged,
    pieces,
    quiet_after,
)
from loadtest.calibrate.levels import Level
from loadtest.calibrate.measure import Timed
from loadtest.calibrate.offline import refit, virtual_run
from loadtest.calibrate.options import Geometry, Options
from loadtest.calibrate.recording import ACCESS_LOG, POLICY, RECORDING, Recording, load, save
from loadtest.calibrate.refine import closed_loop
from loadtest.calibrate.sweep import limits_of

TRUE = StepFit(
    step_s=0.004,
    per_seq_s=0.0004,
    per_prefill_token_s=0.00008,
    per_context_token_s=2e-7,
    admit_s=0.003,
    request_s=0.002,
    request_cv=1.0,  # the spread the calibration takes every front end to have (defaults.REQUEST_CV)
)
GEOMETRY = Geometry(max_model_len=512, block_size=128, num_blocks=2048, vllm_version="0.32.0")
OPTIONS = Options(url="http://real:8000", model="tiny-llama", accelerator="cpu", max_concurrency=16)


def _level(kind: str, concurrency: int, prompt: int, output: int, requests: int) -> Level:
    """A sweep level as a server timed by TRUE would have measured it."""
    limits = limits_of(OPTIONS, GEOMETRY, [])
    sim = closed_loop(TRUE, limits, [(prompt, output)] * requests, concurrency)
    level = Level(kind, concurrency, prompt, output, sim.timed)  # type: ignore[arg-type]
    level.engine_ttft_s, level.engine_itl_s, level.wall_s = sim.engine_ttft_s, sim.engine_itl_s, 1.0
    return level


def _recording() -> Recording:
    levels = [_level("prefill", 1, p, 8, 4) for p in (16, 64, 256, 488)]
    levels += [_level("load", c, p, 32, max(16, 4 * c)) for p in (61, 244) for c in (1, 2, 4, 8, 16)]
    jobs = [[Job([7] * (24 + 37 * i % 400), 16 + i % 48, "chat") for i in range(4 * w)] for w in (3, 6)]
    limits = limits_of(OPTIONS, GEOMETRY, levels)
    real = []
    for level_jobs, width in zip(jobs, (3, 6), strict=True):
        sim = closed_loop(TRUE, limits, [(len(j.prompt), j.output_tokens) for j in level_jobs], width)
        real.append(LevelRun(sim.timed, sim.engine_ttft_s, sim.engine_itl_s))
    return Recording(OPTIONS, GEOMETRY, levels, 7, [3, 6], jobs, real, [0.5, 0.4, 0.3])


def test_max_num_seqs_is_read_off_a_queue_of_all_the_rest_and_not_off_a_request_waiting_a_step() -> None:
    capped = Level("load", 16, 61, 32, [])
    capped.max_running, capped.max_waiting = 8.0, 8.0  # eight ran, the other eight queued
    passing = Level("load", 16, 244, 32, [])
    passing.max_running, passing.max_waiting = 10.0, 2.0  # two seen between arriving and their step
    default = limits_of(OPTIONS, GEOMETRY, []).max_num_seqs
    assert limits_of(OPTIONS, GEOMETRY, [passing]).max_num_seqs == default
    assert limits_of(OPTIONS, GEOMETRY, [passing, capped]).max_num_seqs == 8


def _saved(recording: Recording, tmp_path: Path) -> Path:
    """`recording` saved with a one-line access log and a policy; its directory."""
    log, policy = tmp_path / "access.jsonl", tmp_path / "policy.yaml"
    log.write_text('{"request_class": "chat"}\n')
    policy.write_text("name: p\n")
    save(recording, tmp_path / "rec", log, policy)
    return tmp_path / "rec"


def test_a_recording_round_trips(tmp_path: Path) -> None:
    recording = _recording()
    directory = _saved(recording, tmp_path)
    assert load(directory) == recording
    assert (directory / ACCESS_LOG).read_text() == '{"request_class": "chat"}\n'
    assert (directory / POLICY).read_text() == "name: p\n"
    assert json.loads((directory / RECORDING).read_bytes())["geometry"]["num_blocks"] == 2048


def test_offline_the_fit_sees_the_sweep_and_predicts_the_held_apart_load() -> None:
    """A server that is exactly the step model: the profile refitted from its recorded sweep predicts
    the held-apart levels it never saw within the check's tolerance."""
    recording = _recording()
    profile = refit(recording, refine_s=20.0)
    assert profile.limits.num_blocks == 2048 and profile.step.prefill
    simulated = virtual_run(profile, recording.jobs, recording.widths)
    rows = compare(recording.real, simulated, recording.widths)
    assert not failures(rows), rows
    wrong = msgspec.structs.replace(profile, step=msgspec.structs.replace(TRUE, step_s=0.02))
    assert failures(compare(recording.real, virtual_run(wrong, recording.jobs, recording.widths), [3, 6]))


def test_a_recording_made_before_pieces_reads_as_levels_run_whole(tmp_path: Path) -> None:
    directory = _saved(_recording(), tmp_path)
    raw = json.loads((directory / RECORDING).read_bytes())
    del raw["pieces"]
    (directory / RECORDING).write_text(json.dumps(raw))
    assert load(directory).pieces == 1


def test_levels_run_in_pieces_each_level_s_first_then_each_level_s_second() -> None:
    short = [Job([1] * 30, 16, "chat") for _ in range(7)]
    long = [Job([2] * 300, 16, "bulk") for _ in range(9)]
    rounds = pieces([short, long], 3)
    assert [[(index, len(jobs)) for index, jobs in cut] for cut in rounds] == [
        [(0, 2), (1, 3)],
        [(0, 2), (1, 3)],
        [(0, 3), (1, 3)],
    ]
    for index, level in enumerate((short, long)):  # every job once, in its order
        assert [j for cut in rounds for i, jobs in cut if i == index for j in jobs] == level
    assert pieces([short], 1) == [[(0, short)]]


def test_a_level_merged_from_its_pieces_weighs_the_server_s_means_by_requests() -> None:
    def run(count: int, ttft: float, itl: float) -> LevelRun:
        return LevelRun([Timed(30, 16, 0.0, 0.01, 0.002, 0.04)] * count, ttft, itl, ttft / 2)

    level = merged([run(1, 0.010, 0.002), run(3, 0.030, 0.004)])
    assert len(level.timed) == 4
    assert abs(level.engine_ttft_s - 0.025) < 1e-12 and abs(level.engine_itl_s - 0.0035) < 1e-12
    assert abs(level.engine_own_s - 0.0125) < 1e-12


def test_the_quiet_after_a_piece_is_a_share_of_its_length_from_first_send_to_last_answer() -> None:
    timed = [Timed(30, 16, 10.0, 0.01, 0.002, 0.5), Timed(30, 16, 10.2, 0.01, 0.002, 2.8)]
    timed.append(Timed(30, 16, 12.0, 0.01, 0.002, 0.4))  # sent last, not the last to end
    assert abs(quiet_after(LevelRun(timed, 0.01, 0.002)) - QUIET_SHARE * 3.0) < 1e-9
    assert quiet_after(LevelRun([], 0.0, 0.0)) == 0.0


def test_the_virtual_run_of_a_level_in_pieces_is_a_closed_loop_per_piece() -> None:
    """Each piece starts with every stream sending at once, as on the real server."""
    recording = _recording()
    profile = refit(recording, refine_s=5.0)
    whole = virtual_run(profile, recording.jobs, recording.widths)
    cut = virtual_run(profile, recording.jobs, recording.widths, 3)
    for level, width, jobs in zip(cut, recording.widths, recording.jobs, strict=True):
        expected = []
        for piece in (
            jobs[: len(jobs) // 3],
            jobs[len(jobs) // 3 : 2 * len(jobs) // 3],
            jobs[2 * len(jobs) // 3 :],
        ):
            sizes = [(len(job.prompt), job.output_tokens) for job in piece]
            expected += closed_loop(profile.step, profile.limits, sizes, width).timed
        assert level.timed == expected
    assert [len(level.timed) for level in cut] == [len(level.timed) for level in whole]


def test_the_machines_own_speed_before_the_check_is_kept_and_old_recordings_have_none(tmp_path: Path) -> None:
    recording = _recording()
    recording.core_speeds = {0: [8000, 7990, 4100], 1: [8100, 8050, 8070]}
    directory = _saved(recording, tmp_path)
    assert load(directory).core_speeds == {0: [8000, 7990, 4100], 1: [8100, 8050, 8070]}
    raw = json.loads((directory / RECORDING).read_bytes())
    del raw["core_speeds"]
    (directory / RECORDING).write_text(json.dumps(raw))
    assert load(directory).core_speeds == {}
