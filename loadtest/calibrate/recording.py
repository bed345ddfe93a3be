"""A calibration check's real measurements, kept so the fit and the simulated legs can be re-run offline.

Timing a real server on a shared machine is noisy (the same server twice can differ a lot), so a change
to the model is judged against one recording rather than against a fresh run each time: the sweep's
levels as measured (what the fit sees), the server's geometry, the held-apart load's requests and what
the real server did with them (what the fit never sees), and the real gateway's access log and policy
(what the what-if replay reads). `tests/calibrate/test_calibrate.py` writes one to the directory in
SWITCHYARD_CALIBRATE_RECORD; `python -m loadtest.calibrate.offline DIR` re-runs the rest from it.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from loadtest.calibrate.check import Job, LevelRun
from loadtest.calibrate.levels import Level
from loadtest.calibrate.options import Geometry, Options

RECORDING = "recording.json"
ACCESS_LOG = "access.jsonl"
POLICY = "policy.yaml"


@dataclass(slots=True)
class Recording:
    options: Options
    geometry: Geometry
    levels: list[Level]
    """The sweep's levels, in the order it ran them (the prefix-reuse one included)."""
    seed: int
    widths: list[int]
    jobs: list[list[Job]]
    """The held-apart load, per level."""
    real: list[LevelRun]
    """The held-apart load on the real server, per level."""
    loadavg: list[float]
    """The machine's load averages (1, 5, 15 min) when the real legs ended."""
    pieces: int = 1
    """How many pieces each level ran in (check.pieces); recordings made before pieces ran levels whole."""
    core_speeds: dict[int, list[int]] = field(default_factory=dict)
    """Per CPU, the fixed work counted second by second before the check (core_speed); empty in
    recordings made before the machine was timed."""


def save(recording: Recording, directory: Path, access_log: Path, policy: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / RECORDING).write_bytes(msgspec.json.encode(recording))
    shutil.copyfile(access_log, directory / ACCESS_LOG)
    shutil.copyfile(policy, directory / POLICY)


def load(directory: Path) -> Recording:
    return msgspec.json.decode((directory / RECORDING).read_bytes(), type=Recording)
