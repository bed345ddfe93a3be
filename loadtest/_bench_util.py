"""Process helpers shared by the load-test benchmarks.

Children are started in their own session (so their process group id equals their pid), optionally pinned
to one CPU before ``exec`` (so every thread and child process they create inherits the pin), and are
stopped by signalling that process group only.  :class:`ProcessGroup` remembers everything it started and
stops it on ``close()``, on interpreter exit and on SIGINT/SIGTERM/SIGHUP (turned into ``KeyboardInterrupt``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

CLK_TCK = os.sysconf("SC_CLK_TCK")


def usable_cpus() -> list[int]:
    """CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pick_cpus() -> tuple[int, int]:
    """(proxy CPU, load CPU): the first two usable CPUs, or the same one on a single-CPU machine."""
    cpus = usable_cpus()
    return cpus[0], cpus[1] if len(cpus) > 1 else cpus[0]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def which(name: str, *extra_dirs: str) -> str | None:
    """Path of an executable on PATH or in ``extra_dirs`` (e.g. /usr/sbin, not on every PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for directory in extra_dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _pin_to(cpu: int | None) -> Callable[[], None] | None:
    if cpu is None:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, {cpu})

    return pin


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` fields after the command name (fields[0] is stat field 3, the state)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2 :].split()


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by process ``pid`` (all threads), outside any session."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime = stat fields 14, 15


def _session_stats(sid: int) -> list[list[str]]:
    """``/proc/<pid>/stat`` fields (after the command name) of every live process in session ``sid``."""
    rows: list[list[str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except OSError:
            continue
        # fields[0] is state (stat field 3); session is stat field 6 -> fields[3].
        if int(fields[3]) == sid:
            rows.append(fields)
    return rows


def session_cpu_seconds(sid: int) -> float:
    """User+system CPU seconds used so far by all live processes of session ``sid`` (all threads)."""
    ticks = sum(int(f[11]) + int(f[12]) for f in _session_stats(sid))  # utime, stime = stat fields 14, 15
    return ticks / CLK_TCK


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
                preexec_fn=_pin_to(cpu),
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


def http_post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    """One blocking POST (for readiness checks and validation); returns (status, body)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def assert_loopback(url: str) -> None:
    """Refuse anything but http://127.0.0.1 targets."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"only http://127.0.0.1 targets are allowed, got {url!r}")


def python_argv(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with the current interpreter."""
    return [sys.executable, "-m", module, *args]


def healthy(url: str) -> bool:
    """Whether `url` answers `GET /health` with 200 (no proxy; raises OSError while it is not up yet)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/health", timeout=1) as response:
        return bool(response.status == 200)


def start_zero_delay_backend(group: ProcessGroup, model: str, cpu: int | None) -> str:
    """A simulated backend that answers at once (its own time is only HTTP work); returns its URL once up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    assert_loopback(url)
    child = group.start(
        "backend",
        python_argv(
            "backends.sim", "--port", str(port), "--model", model, "--ttft-ms", "0", "--tpot-ms", "0"
        ),
        cpu=cpu,
    )
    wait_until(lambda: healthy(url), timeout=30, what="backend", child=child)
    return url
