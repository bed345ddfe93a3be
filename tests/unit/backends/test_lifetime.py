"""`stop_process`: the one way a started process is stopped (the cluster, the load test's helpers, tests)."""

from __future__ import annotations

import subprocess
import sys
import time

from backends.lifetime import stop_process

_IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)"
)


def _start(code: str) -> subprocess.Popen[bytes]:
    process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert process.stdout is not None and process.stdout.readline()  # its handlers are in place
    return process


def test_a_process_that_stops_on_sigterm_is_stopped_and_reaped() -> None:
    process = _start("import time; print(1, flush=True); time.sleep(60)")
    stop_process(process)
    assert process.returncode == -15


def test_one_that_ignores_sigterm_is_killed_after_its_grace() -> None:
    process = _start(_IGNORES_SIGTERM)
    started = time.monotonic()
    stop_process(process, grace=0.3)
    assert process.returncode == -9 and time.monotonic() - started >= 0.3


def test_stopping_one_that_already_exited_does_nothing() -> None:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    stop_process(process)
    assert process.returncode == 0
