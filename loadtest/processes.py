"""Child processes the load test starts (simulated fleet, gateways), and the guarantee that they stop.

Children are started in their own session (so their process group id equals their pid), optionally pinned
to one CPU before ``exec`` (so every thread and child process they create inherits the pin), and are
stopped by signalling that process group only.  :class:`ProcessGroup` remembers everything it started and
stops it on ``close()``, on interpreter exit and on SIGINT/SIGTERM/SIGHUP (turned into ``KeyboardInterrupt``);
a child gets SIGKILL from the kernel when this process dies without that chance (a SIGKILL of its own).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import time
import urllib.error
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from backends.lifetime import die_with_parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _preexec(cpu: int | None) -> Callable[[], None] | None:
    """In the child: ends with this process whatever signal ends it (backends/lifetime.py), on `cpu`."""
    on_death = die_with_parent()
    if cpu is None:
        return on_death

    def start() -> None:
        if on_death is not None:
            on_death()
        os.sched_setaffinity(0, {cpu})

    return start


@dataclass
class Child:
    """One started process (leader of its own session / process group)."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, limit: int = 2000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""


@dataclass
class ProcessGroup:
    """Starts pinned children in their own sessions and guarantees they are stopped."""

    log_dir: Path
    children: list[Child] = field(default_factory=list)
    _installed: bool = False

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        cpu: int | None = None,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> Child:
        self._install_handlers()
        log_path = self.log_dir / f"{name}.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_preexec(cpu),
                env=env,
                cwd=cwd,
            )
        child = Child(name, proc, log_path)
        self.children.append(child)
        return child

    def stop(self, child: Child, grace: float = 5.0) -> None:
        """SIGTERM the child's process group, SIGKILL it after ``grace`` seconds."""
        if child in self.children:
            self.children.remove(child)
        _signal_group(child.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while child.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(child.pid, signal.SIGKILL)  # also reaps stragglers of the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.proc.wait(timeout=2)

    def close(self) -> None:
        for child in list(reversed(self.children)):
            self.stop(child)

    def _install_handlers(self) -> None:
        if self._installed:
            return
        self._installed = True
        atexit.register(self.close)


def install_interrupt_handlers() -> None:
    """Turn SIGINT/SIGTERM/SIGHUP into KeyboardInterrupt, so `finally` blocks stop the children.

    For a benchmark's `main` only: SIGINT may be ignored when it runs in the background (`&`).
    """
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_interrupt)


def _raise_interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def wait_until(check: Callable[[], bool], *, timeout: float, what: str, child: Child | None = None) -> None:
    """Poll ``check`` every 50 ms until it is true; raise with the child's log tail on timeout/death."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child is not None and not child.alive():
            raise RuntimeError(f"{what}: process exited with {child.proc.returncode}\n{child.log_tail()}")
        with contextlib.suppress(OSError, urllib.error.URLError, ConnectionError):
            if check():
                return
        time.sleep(0.05)
    tail = child.log_tail() if child is not None else ""
    raise TimeoutError(f"{what}: not ready after {timeout:.0f}s\n{tail}")
