"""The load test's children stop with it, whatever ends it (loadtest/processes.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

PARENT = """
import sys, time
from pathlib import Path
from loadtest.processes import ProcessGroup
group = ProcessGroup(Path(sys.argv[1]))
child = group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], cpu={cpu})
print(child.pid, flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is gone, only not yet reaped
        return stat.read().rsplit(")", 1)[1].split()[0] != "Z"


def _child_of_a_killed_parent(tmp_path: Path, cpu: int | None) -> int:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(cpu=cpu), str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)  # no handler, no atexit: only the kernel can stop the child
    parent.wait()
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    return child


@pytest.mark.parametrize("cpu", [None, 0], ids=["unpinned", "pinned"])
def test_a_child_dies_with_a_parent_killed_outright(tmp_path: Path, cpu: int | None) -> None:
    child = _child_of_a_killed_parent(tmp_path, cpu)
    try:
        assert not _alive(child), f"child {child} outlived its SIGKILLed parent"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
