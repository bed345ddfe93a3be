"""Re-run a calibration check from a recording (loadtest/calibrate/recording.py), without the real server.

    python -m loadtest.calibrate.offline DIR [--http] [--refine-s 60] [--linear-decode] [--no-spells]
                                             [--profile PROFILE]

It fits the profile from the recorded sweep exactly as `switchyard calibrate` does (the fit sees the
sweep only), writes it to DIR/offline-profile.yaml (`--linear-decode`: without the decode curve, to
DIR/offline-linear.yaml; `--no-spells`: without the server's slow spells, to DIR/offline-*-steady.yaml),
runs the recorded held-apart load on the simulator's scheduler on a virtual clock (`--http`: on
`python -m backends.sim` servers of the profile and of the built-in MI300X one, as the test does), prints the
comparison with the recorded real run, and replays the recorded access log with `whatif` for the SLO
attainment per class (`--profile`: of that profile, not fitting one). Exit status 0 when every level and
every class agrees.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from backends.calibrated import CalibratedProfile, dump_profile, load_profile
from backends.lifetime import stop_process
from loadtest.calibrate.agreement import (
    calibrated_fleet,
    logged_attainment,
    off_by_more,
    slos_from_log,
)
from loadtest.calibrate.check import (
    TOLERANCE,
    Job,
    LevelRun,
    Target,
    bursts,
    compare,
    failures,
    format_rows,
    merged,
    pieces,
    run_interleaved,
)
from loadtest.calibrate.core_speed import CoreSpeed, report
from loadtest.calibrate.gap import format_parts, replayed_with_parts
from loadtest.calibrate.legs import POOL, SCRAPE_S, WRONG, calibrated_timing, start_simulator
from loadtest.calibrate.recording import ACCESS_LOG, POLICY, Recording, load
from loadtest.calibrate.refine import closed_loop
from loadtest.calibrate.sweep import fit_profile


def refit(
    recording: Recording, refine_s: float, decode_curve: bool = True, spells: bool = True
) -> CalibratedProfile:
    deadline = time.monotonic() + refine_s
    return fit_profile(
        recording.options,
        recording.geometry,
        recording.levels,
        deadline,
        lambda _: None,
        decode_curve=decode_curve,
        spells=spells,
    )


def virtual_run(
    profile: CalibratedProfile, levels: Sequence[list[Job]], widths: Sequence[int], count: int = 1
) -> list[LevelRun]:
    """The held-apart load on the simulator's scheduler on a virtual clock (refine.closed_loop), each
    level in `count` pieces (check.pieces), each piece a closed loop of its own, as the real run had it."""
    runs: list[list[LevelRun]] = [[] for _ in levels]
    for index, jobs in (piece for cut in pieces(levels, count) for piece in cut):
        sizes = [(len(job.prompt), job.output_tokens) for job in jobs]
        sim = closed_loop(profile.step, profile.limits, sizes, widths[index])
        runs[index].append(LevelRun(sim.timed, sim.engine_ttft_s, sim.engine_itl_s))
    return [merged(level) for level in runs]


def http_runs(
    profile_path: Path, recording: Recording, workdir: Path
) -> tuple[list[LevelRun], list[LevelRun]]:
    """The held-apart load on a simulator of the profile and one of the built-in MI300X profile."""
    model, max_model_len = recording.options.model, recording.geometry.max_model_len
    processes = []
    try:
        targets = []
        for name, timing in (("calibrated", calibrated_timing(profile_path)), ("wrong", WRONG)):
            process, url = start_simulator(timing, model, max_model_len, workdir / f"offline-{name}.log")
            processes.append(process)
            targets.append(Target(url, url))
        calibrated, wrong = asyncio.run(
            run_interleaved(targets, model, recording.jobs, recording.widths, recording.pieces)
        )
    finally:
        for process in processes:
            stop_process(process)
    return calibrated, wrong


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.calibrate.offline", description=__doc__)
    parser.add_argument("directory", type=Path)
    parser.add_argument("--http", action="store_true", help="time the simulated legs on simulator servers")
    parser.add_argument("--refine-s", type=float, default=60.0, help="the refinement's time (default 60)")
    parser.add_argument(
        "--linear-decode", action="store_true", help="fit without the decode curve (per_seq_s alone)"
    )
    parser.add_argument(
        "--no-spells", action="store_true", help="fit without the server's slow spells (every step its mean)"
    )
    parser.add_argument(
        "--profile", type=Path, help="check this profile instead of fitting one (the fit options are ignored)"
    )
    args = parser.parse_args(argv)
    directory: Path = args.directory
    recording = load(directory)
    print(f"recording {directory}: load average {recording.loadavg} when its real legs ended")
    speeds = [CoreSpeed(cpu, tuple(counts)) for cpu, counts in sorted(recording.core_speeds.items())]
    for line in report(speeds) if speeds else []:
        print(f"the machine before the check: {line}")
    if args.profile is not None:
        profile_path = args.profile
    else:
        name = "offline-linear" if args.linear_decode else "offline-profile"
        profile_path = directory / f"{name}{'-steady' if args.no_spells else ''}.yaml"
        profile_path.write_text(
            dump_profile(refit(recording, args.refine_s, not args.linear_decode, not args.no_spells))
        )
    profile = load_profile(profile_path)
    failed = False
    if args.http:
        simulated, wrong = http_runs(profile_path, recording, directory)
        rows = compare(recording.real, wrong, recording.widths)
        print(f"\nbuilt-in MI300X profile (simulator servers):\n{format_rows(rows)}")
    else:
        simulated = virtual_run(profile, recording.jobs, recording.widths, recording.pieces)
    rows = compare(recording.real, simulated, recording.widths)
    print(f"\ncalibrated profile ({profile_path}, {'simulator server' if args.http else 'virtual clock'}):")
    print(format_rows(rows))
    asserted = [row for row in rows if row.asserted]
    print(f"{len(asserted) - len(failures(rows))} of {len(asserted)} within {TOLERANCE:.0%}")
    failed |= bool(failures(rows))
    for note in bursts(recording.real, recording.widths):
        print(f"note: {note}")
    log, policy = directory / ACCESS_LOG, directory / POLICY
    slos = slos_from_log(log)
    real = logged_attainment(log, slos)
    fleet = calibrated_fleet(profile_path, recording.options.model, recording.geometry.max_model_len, POOL)
    replayed, departs = replayed_with_parts(log, fleet, policy, slos, SCRAPE_S)
    print("\nSLO attainment per class (real run / replay on the profile):")
    for cls, share in real.items():
        off = abs(replayed.get(cls, 0.0) - share)
        print(f"  {cls:6} {share:6.1%} {replayed.get(cls, 0.0):6.1%}  ({off * 100:.1f} points)")
    print(f"\nwhere it departs (real run / replay):\n{format_parts(departs)}")
    return 1 if failed or off_by_more(real, replayed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
