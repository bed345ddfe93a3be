"""Child processes that do not outlive the process that started them, whatever signal ends it.

Two halves: `die_with_parent()` is a `preexec_fn` for `subprocess.Popen` that asks Linux to signal
the child when its parent dies (PR_SET_PDEATHSIG: covers SIGKILL of the parent, which no handler
sees), and `exit_on_termination()` turns SIGTERM and SIGHUP into `SystemExit` in the parent so its
`finally` blocks and context managers stop the children cleanly, as Ctrl-C already does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from types import FrameType

_PR_SET_PDEATHSIG = 1
TERMINATION_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive `sig` when the parent dies (None off Linux).

    Linux sends it when the thread that started the child ends, so start children from the
    thread that lives as long as they should (the main thread, in every caller here).
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # loaded before the fork, not in the child
    parent = os.getpid()

    def preexec() -> None:
        _signal_on_parent_death(prctl, sig, parent)

    return preexec


def end_with_parent(sig: signal.Signals = signal.SIGTERM) -> None:
    """Have Linux send the calling process `sig` when its parent dies (what `die_with_parent` does for
    a child, for a process about to exec a server in its place); nothing off Linux."""
    if sys.platform.startswith("linux"):
        _signal_on_parent_death(ctypes.CDLL(None, use_errno=True).prctl, sig, os.getppid())


def _signal_on_parent_death(prctl: Callable[..., int], sig: signal.Signals, parent: int) -> None:
    prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    # The parent may have died before prctl took: then nobody will send `sig` any more.
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def _exit(signum: int, _frame: FrameType | None) -> None:
    # Later signals must not interrupt the clean-up this exception starts.
    for sig in TERMINATION_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def exit_on_termination() -> Iterator[None]:
    """In the block, SIGTERM and SIGHUP raise SystemExit(128 + signal) as Ctrl-C raises KeyboardInterrupt."""
    previous = {sig: signal.signal(sig, _exit) for sig in TERMINATION_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_process(process: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """SIGTERM one process, SIGKILL it after `grace` seconds, and reap it (a no-op once it has exited)."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
