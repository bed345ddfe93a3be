"""A server started below its clients runs at nice `NICE`, in its own session and autogroup,
and the process that started it keeps its own priority (backends/cpu_priority.py)."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.cpu_priority import NICE, autogroup_nice, compute_apart, on_clients_core
from backends.launcher import Launch, add_arguments, build_launch, spec_from_args
from backends.server_process import start, stop

SLEEPER = "import time; time.sleep(60)"


def _wait_started(process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # until the child has exec'd (its preexec has run by then)
        if Path(f"/proc/{process.pid}/cmdline").read_bytes().endswith(SLEEPER.encode() + b"\0"):
            return
        time.sleep(0.02)
    raise AssertionError("the child did not start")


def _nice(pid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, pid)


@pytest.mark.parametrize("below", [True, False])
def test_a_server_below_its_clients_runs_at_a_lower_priority(tmp_path: Path, below: bool) -> None:
    mine, my_group = _nice(0), autogroup_nice(os.getpid())
    launch = Launch(argv=(sys.executable, "-c", SLEEPER), env={}, url="http://127.0.0.1:1")
    process = start(launch, tmp_path / "server.log", below_clients=below)
    try:
        _wait_started(process)
        assert os.getsid(process.pid) == process.pid  # its own session, so its own autogroup
        assert _nice(process.pid) == (NICE if below else mine)
        group = autogroup_nice(process.pid)
        if group is not None:  # the kernel has autogroups
            assert group == (NICE if below else 0)
        assert _nice(0) == mine and autogroup_nice(os.getpid()) == my_group  # the starter's unchanged
    finally:
        stop(process, grace=5)


def test_the_launcher_cli_runs_the_server_in_its_own_session_below_its_clients(tmp_path: Path) -> None:
    """`--below-clients --run`: a new session below its clients, then the server (here a stand-in
    for the CPU build's interpreter that records what it got)."""
    seen = tmp_path / "seen"
    fake = tmp_path / "python"
    record = (
        '"$(ps -o sid= -p $$) $$ $(ps -o ni= -p $$) ${VLLM_CPU_OMP_THREADS_BIND:--} ${OMP_NUM_THREADS:--}"'
    )
    fake.write_text(f"#!/bin/sh\necho {record} > {seen}\nexec sleep 60\n")
    fake.chmod(0o755)
    argv = [sys.executable, "-m", "backends.launcher", "--vendor", "cpu", "--model", "m"]
    argv += ["--python", str(fake), "--port", "18999", "--below-clients", "--run"]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not seen.exists() or not seen.read_text().strip():
            assert time.monotonic() < deadline, "the server stand-in did not start"
            assert process.poll() is None, "the launcher exited"
            time.sleep(0.05)
        sid_text, pid_text, nice_text, bind, threads = seen.read_text().split()
        sid, pid, nice = int(sid_text), int(pid_text), int(nice_text)
        assert pid == process.pid  # `--run` replaced the launcher
        assert sid == pid  # a session of its own
        assert nice == NICE
        group = autogroup_nice(pid)
        assert group in (None, NICE)
        apart = compute_apart()  # its compute threads off the first core, where there are two or more
        assert (bind, threads) == (
            apart.get("VLLM_CPU_OMP_THREADS_BIND", "-"),
            apart.get("OMP_NUM_THREADS", "-"),
        )
    finally:
        process.kill()
        process.wait()


def test_a_server_run_below_its_clients_ends_with_the_process_that_started_it(tmp_path: Path) -> None:
    """Out of its caller's session, a Ctrl-C to the caller's terminal no longer reaches it: it gets
    SIGTERM when its caller dies instead, even by SIGKILL."""
    seen = tmp_path / "seen"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho $$ > {seen}\nexec sleep 60\n")
    fake.chmod(0o755)
    launcher = f"{sys.executable} -m backends.launcher --vendor cpu --model m --python {fake} --port 18998"
    caller = subprocess.Popen(["bash", "-c", f"{launcher} --below-clients --run & wait"])
    try:
        deadline = time.monotonic() + 20
        while not seen.exists() or not seen.read_text().strip():
            assert time.monotonic() < deadline, "the server stand-in did not start"
            time.sleep(0.05)
        server = int(seen.read_text())
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 10
        while Path(f"/proc/{server}").exists() and Path(f"/proc/{server}/stat").read_text().split()[2] != "Z":
            assert time.monotonic() < deadline, "the server outlived the process that started it"
            time.sleep(0.05)
    finally:
        caller.kill()
        with contextlib.suppress(ProcessLookupError, NameError):
            os.kill(server, signal.SIGKILL)


def test_the_cpu_builds_compute_threads_leave_the_first_core_to_the_clients() -> None:
    assert compute_apart([0, 1]) == {
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "OMP_NUM_THREADS": "1",
        "SWITCHYARD_ENGINE_CPUS": "1",
        "SWITCHYARD_FRONT_CPUS": "0",
    }
    apart = compute_apart([3, 0, 2, 1])
    assert apart["VLLM_CPU_OMP_THREADS_BIND"] == apart["SWITCHYARD_ENGINE_CPUS"] == "1,2,3"
    assert (apart["OMP_NUM_THREADS"], apart["SWITCHYARD_FRONT_CPUS"]) == ("3", "0")
    assert compute_apart([4]) == {}  # one core: nothing to keep apart


def _launch_env(*args: str) -> dict[str, str]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_launch(spec_from_args(parser.parse_args(["--model", "m", *args]))).env


def test_below_clients_keeps_a_cpu_servers_compute_apart_and_an_explicit_env_wins() -> None:
    apart = compute_apart()
    assert apart.items() <= _launch_env("--vendor", "cpu", "--below-clients").items()
    assert "VLLM_CPU_OMP_THREADS_BIND" not in _launch_env("--vendor", "cpu")
    assert "OMP_NUM_THREADS" not in _launch_env(
        "--vendor", "nvidia", "--accelerator", "h100", "--below-clients"
    )
    chosen = _launch_env("--vendor", "cpu", "--below-clients", "--env", "OMP_NUM_THREADS=7")
    assert chosen["OMP_NUM_THREADS"] == "7"


def test_clients_core_holds_this_thread_and_what_it_starts_then_gives_every_core_back() -> None:
    before = os.sched_getaffinity(0)
    if len(before) < 2:
        pytest.skip("one CPU: nothing to keep apart")
    first = min(before)
    with on_clients_core():
        assert os.sched_getaffinity(0) == {first}
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert child.stdout.strip() == f"[{first}]"
    assert os.sched_getaffinity(0) == before
    with contextlib.suppress(RuntimeError), on_clients_core():
        raise RuntimeError("a failed run gives the cores back too")
    assert os.sched_getaffinity(0) == before


def test_clients_core_changes_nothing_on_one_cpu() -> None:
    before = os.sched_getaffinity(0)
    with on_clients_core([min(before)]):
        assert os.sched_getaffinity(0) == before
