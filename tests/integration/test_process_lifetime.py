"""`switchyard demo` and `switchyard sim fleet` as a user, a service manager or a CI timeout runs them.

Whatever signal ends them (SIGTERM, SIGHUP, even SIGKILL), none of the processes they started may
keep running or keep a port; a demo told to use a port that is taken refuses instead of talking to
whatever listens there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, RecordingBackend, free_port, free_port_block

_URL = re.compile(r"http://127\.0\.0\.1:(\d+)")
_ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process still running (zombies count as gone)."""
    table: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if fields[0] != "Z":
                table[int(entry.name)] = int(fields[1])
    return table


def _descendants(root: int) -> set[int]:
    table = _parents()
    found: set[int] = set()
    frontier = {root}
    while frontier:
        frontier = {pid for pid, parent in table.items() if parent in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    return pids & set(_parents())


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class _Run:
    """A started command: its output (read on a thread) and the processes it started."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.text = ""
        self.children: set[int] = set()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.text += line

    def wait_for(self, marker: str, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while marker not in self.text:
            code = self.process.poll()
            assert code is None, f"exited with {code} before `{marker}`:\n{self.text}"
            assert time.monotonic() < deadline, f"no `{marker}` within {timeout:.0f} s:\n{self.text}"
            time.sleep(0.1)

    def ports(self) -> list[int]:
        return [int(port) for port in _URL.findall(self.text)]

    def note_children(self) -> set[int]:
        self.children = _descendants(self.process.pid)
        return self.children

    def assert_all_gone(self, ports: list[int]) -> None:
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 15
        while (_alive(self.children) or any(map(_listening, ports))) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(self.children), f"children outlived their parent: {_alive(self.children)}"
        assert not [p for p in ports if _listening(p)], "ports still served"


@contextlib.contextmanager
def _started(argv: list[str]) -> Iterator[_Run]:
    # A command killed with SIGKILL cannot remove its temporary folders: they go under one of the test's.
    temp = tempfile.mkdtemp(prefix="switchyard-lifetime-")
    process = subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**_ENV, "TMPDIR": temp},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    run = _Run(process)
    try:
        yield run
    finally:
        # Whatever the test found, leave nothing running, orphans included.
        for pid in _descendants(process.pid) | _alive(run.children) | {process.pid}:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=10)
        shutil.rmtree(temp, ignore_errors=True)


def _demo_argv(port: int) -> list[str]:
    return [sys.executable, "-m", "gateway.cli", "demo", "--port", str(port), "--requests", "2"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_demo_children_die_with_the_demo(sig: signal.Signals) -> None:
    port = free_port()
    with _started(_demo_argv(port)) as demo:
        demo.wait_for("press Ctrl-C to stop")
        ports = [port, *demo.ports()]
        assert len(demo.note_children()) >= 5 and len(set(ports)) == 5, demo.text  # gateway + 4 backends
        demo.process.send_signal(sig)
        demo.assert_all_gone(ports)
    if sig != signal.SIGKILL:
        assert demo.process.returncode == 128 + sig, demo.text


def test_make_demo_stops_everything_on_sigterm() -> None:
    port = free_port()
    with _started(["make", "--no-print-directory", "demo", f"ARGS=--port {port} --requests 2"]) as make:
        make.wait_for("press Ctrl-C to stop")
        ports = [port, *make.ports()]
        assert len(make.note_children()) >= 6, make.text  # the demo, the gateway, four backends
        make.process.send_signal(signal.SIGTERM)
        make.assert_all_gone(ports)


@pytest.mark.parametrize(
    ("command", "sig"),
    [
        (["gateway.cli", "sim", "fleet"], signal.SIGTERM),
        (["gateway.cli", "sim", "fleet"], signal.SIGKILL),
        (["backends.sim.fleet"], signal.SIGHUP),
        (["backends.sim.fleet"], signal.SIGKILL),
    ],
    ids=["switchyard-SIGTERM", "switchyard-SIGKILL", "module-SIGHUP", "module-SIGKILL"],
)
def test_fleet_children_die_with_the_fleet(command: list[str], sig: signal.Signals, tmp_path: Path) -> None:
    base = free_port_block(4)
    config = tmp_path / "gateway.yaml"
    argv = [sys.executable, "-m", *command, "--base-port", str(base), "--write-config", str(config)]
    with _started(argv) as fleet:
        fleet.wait_for("gateway config written", timeout=60)
        assert fleet.ports() == [base, base + 1, base + 2, base + 3]
        assert len(fleet.note_children()) == 4
        fleet.process.send_signal(sig)
        fleet.assert_all_gone(fleet.ports())


def test_switchyard_sim_fleet_takes_the_options_docs_simulator_shows() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "sim", "fleet", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert "usage: switchyard sim fleet" in result.stdout
    for option in ("--config", "--base-port", "--write-config", "--log-dir"):
        assert option in result.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "sim", "fleet", "--no-such-option"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 2 and "--no-such-option" in bad.stderr


def test_demo_refuses_a_port_that_is_taken() -> None:
    with RecordingBackend("llama-3.1-8b") as occupier:
        port = int(occupier.url.rsplit(":", 1)[1])
        result = subprocess.run(
            [*_demo_argv(port), "--exit-after-traffic"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode != 0
    assert f"cannot serve on 127.0.0.1:{port}" in result.stderr
    assert "--port" in result.stderr
    assert occupier.requests == []
