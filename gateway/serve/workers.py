"""`gateway.workers: N`: N gateway processes on one port, each a full replica.

Why processes and SO_REUSEPORT: one gateway process is one event loop on one core; the request path is
CPU-bound Python, so a second core needs a second interpreter. Each worker binds its own listening
socket with SO_REUSEPORT and the kernel spreads new connections over them (no accept() thundering herd,
no shared accept lock, no fd passing). uvicorn's own `--workers` shares one socket and has no
reuseport mode, hence this small supervisor. Workers share state exactly as replicas do: the ledger and
the fleet view (gateway/fleet_sync.py) through Redis; without `ledger.redis_url` each worker has its
own view, and the supervisor says so.

The supervisor restarts a worker that dies (at most once a second per worker), forwards SIGTERM/SIGINT
to every worker (each then drains for `gateway.shutdown_grace`), and each worker asks the kernel for
SIGTERM when its parent dies (PR_SET_PDEATHSIG), so none outlives a SIGKILLed supervisor.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("switchyard.workers")

PR_SET_PDEATHSIG = 1
RESTART_MIN_INTERVAL = 1.0


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask Linux to send `sig` to this process when its parent exits (a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT (not yet listening)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    def __init__(self, config: str, host: str, port: int, workers: int, log_level: str, grace: float) -> None:
        self.config = config
        self.host = host
        self.workers = workers
        self.log_level = log_level
        self.grace = grace
        # Held bound (never listening) for the supervisor's life: fixes the port when 0 was asked for.
        self._reserved = reuseport_socket(host, port)
        self.port = int(self._reserved.getsockname()[1])
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.started: dict[int, float] = {}
        self.restarts = 0
        self._stopping = False

    def _command(self, index: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "gateway.serve.workers",
            "--config",
            self.config,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--log-level",
            self.log_level,
            "--parent",
            str(os.getpid()),
            "--index",
            str(index),
        ]

    def _spawn(self, index: int) -> None:
        self.children[index] = subprocess.Popen(self._command(index), cwd=Path.cwd())
        self.started[index] = time.monotonic()

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stopping = True
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for index in range(self.workers):
            self._spawn(index)
        log.info("switchyard: %d workers on %s:%d (SO_REUSEPORT)", self.workers, self.host, self.port)
        while not self._stopping:
            time.sleep(0.1)
            for index, child in list(self.children.items()):
                code = child.poll()
                if code is None or self._stopping:
                    continue
                if time.monotonic() - self.started[index] < RESTART_MIN_INTERVAL:
                    continue  # crashing at start: retry at most once a second
                log.warning("switchyard: worker %d (pid %d) exited (%s); restarting", index, child.pid, code)
                self.restarts += 1
                self._spawn(index)
        deadline = time.monotonic() + self.grace + 5
        for child in self.children.values():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._reserved.close()
        return 0


def serve_workers(config: str, host: str, port: int, workers: int, log_level: str, grace: float) -> int:
    return Supervisor(config, host, port, workers, log_level, grace).run()


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.serve.workers")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    args = parser.parse_args(argv)
    die_with_parent()
    if os.getppid() != args.parent:  # the parent died before prctl took effect
        return 1
    from gateway.config.settings import load_settings
    from gateway.serve.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("switchyard.access").setLevel(args.log_level.upper())
    settings = load_settings(args.config)
    sock = reuseport_socket(args.host, args.port)
    sock.listen(2048)
    run_server(settings, args.host, args.port, args.log_level, main_socket=sock)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker_main())
