"""Running a launched vLLM server (backends/launcher.py builds its command): its own process group, so
stopping it ends every child it started, and it never outlives the process that started it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from backends import cpu_priority
from backends.launcher import Launch
from backends.lifetime import die_with_parent


def start(
    launch: Launch,
    log_path: Path,
    base_env: Mapping[str, str] | None = None,
    below_clients: bool = False,
) -> subprocess.Popen[bytes]:
    """Start the server in its own process group, stdout and stderr into `log_path`.

    The server gets SIGTERM when this process dies, even by SIGKILL, so it never outlives it: SIGTERM, not
    SIGKILL, because vLLM stops its EngineCore process on SIGTERM and a SIGKILLed server leaves it running
    (tests/vllm/test_lifetime.py).
    `below_clients`: it runs a little below them in CPU priority, so clients timing it from the same machine
    are not kept waiting by its spinning engine (backends/cpu_priority.py).
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    on_death = die_with_parent(signal.SIGTERM)

    def preexec() -> None:
        if on_death is not None:
            on_death()
        if below_clients:
            cpu_priority.below_clients()

    with log_path.open("wb") as log:
        return subprocess.Popen(
            list(launch.argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=launch.full_env(base_env),
            start_new_session=True,
            preexec_fn=preexec,
        )


def log_tail(log_path: Path, lines: int = 40) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def wait_ready(
    url: str, process: subprocess.Popen[bytes] | None, log_path: Path, timeout: float = 180.0
) -> float:
    """Poll `url`/health until it answers 200; returns the seconds taken.

    Raises RuntimeError with the log's tail when the process exits or `timeout` passes first.
    """
    started = time.monotonic()
    deadline = started + timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"vLLM server for {url} exited with {process.returncode} before it was ready; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        with contextlib.suppress(OSError, urllib.error.URLError, ValueError):
            with opener.open(url + "/health", timeout=2) as r:
                healthy = r.status == 200
            # Something else may answer /health on that port (a stale server): ask for the model list too.
            if healthy:
                with opener.open(url + "/v1/models", timeout=2) as r:
                    if r.status == 200 and isinstance(json.loads(r.read()).get("data"), list):
                        return time.monotonic() - started
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"vLLM server for {url} not ready within {timeout:.0f} s; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        time.sleep(0.5)


def stop(process: subprocess.Popen[bytes], grace: float = 15.0) -> None:
    """SIGTERM the process group, then SIGKILL it after `grace` seconds."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace)
    # Children may outlive the leader; the group id is the leader's pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5)


# The CLI.
