"""`gateway.workers: N`: N gateway processes on one port, each a full replica.

Why processes: one gateway process is one event loop on one core; the request path is CPU-bound Python,
so a second core needs a second interpreter. Workers share state exactly as replicas do: the ledger and
the fleet view (gateway/fleet_sync.py) through Redis; without `ledger.redis_url` each worker has its own
view, and the supervisor says so.

Why the supervisor accepts: the load is the connections, and they are few and long-lived (an ingress or
HAProxy keeps a small pool of keep-alive connections upstream). With one SO_REUSEPORT socket per worker
the kernel picks a worker by a hash of the 4-tuple, so 8 connections often split 5/3 or 6/2 and one worker
saturates while the other idles. So the supervisor owns the one listening socket, accepts, and hands each
connection's fd (SCM_RIGHTS over a SOCK_SEQPACKET socketpair) to the ready worker with the fewest open
connections; each worker reports every close on the same channel (gateway/serve/handoff.py), so the counts
are live and 8 connections split 4/4. The worker serves the fd exactly as a connection it accepted itself
(peer address, PROXY header, per-client caps, limits), each worker counting its own connections as a
replica does. The cost is one accept and one sendmsg in the supervisor per new connection (keep-alive
traffic pays nothing per request), measured at about 0.1 ms of the supervisor's CPU and 0.2 ms more
latency per connection (loadtest/bench/workers_connect.py). Clients that open a connection per request
at thousands a second are better served by `gateway.worker_balance: reuseport`: each worker binds its own
SO_REUSEPORT socket and the kernel spreads connections by hash, for free and evenly when they are many
(the supervisor then only holds the port bound and watches the workers). The admin port
(`gateway.admin_port`, little traffic) is bound by every worker with SO_REUSEPORT in either mode.

The supervisor restarts a worker that dies (at most once a second per worker; its connections died with
it, so its count starts again at 0, and it gets connections once it reports ready), forwards SIGTERM/SIGINT
to every worker after closing the listening socket (each then drains for `gateway.shutdown_grace`), and
each worker asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG), so none outlives a
SIGKILLed supervisor; a worker whose channel reaches EOF also shuts down.
"""

from __future__ import annotations

import argparse
import collections
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Literal

from backends.lifetime import end_with_parent
from gateway.serve.handoff import CLOSED, CONNECTION, READY

log = logging.getLogger("switchyard.workers")

RESTART_MIN_INTERVAL = 1.0
_CONNECTION = [CONNECTION]
ACCEPT_BURST = 64
"""Connections accepted per wake-up before the channels are read again."""


class Worker:
    """The supervisor's view of one worker: its process, its end of the channel, its open connections."""

    def __init__(self, index: int, process: subprocess.Popen[bytes], channel: socket.socket) -> None:
        self.index = index
        self.process = process
        self.channel = channel
        self.started = time.monotonic()
        self.ready = False
        self.open = 0
        self.handed = 0


Balance = Literal["least_connections", "reuseport"]


def reuseport_socket(host: str, port: int) -> socket.socket:
    """A socket bound to host:port with SO_REUSEPORT (not yet listening)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


class Supervisor:
    def __init__(
        self,
        config: str,
        host: str,
        port: int,
        workers: int,
        log_level: str,
        grace: float,
        balance: Balance = "least_connections",
    ) -> None:
        self.config = config
        self.host = host
        self.workers = workers
        self.log_level = log_level
        self.grace = grace
        self.balance = balance
        self.listener: socket.socket | None = None
        self._reserved: socket.socket | None = None
        if balance == "reuseport":
            # Held bound (never listening) for the supervisor's life: fixes the port when 0 was asked for.
            self._reserved = reuseport_socket(host, port)
            self.port = int(self._reserved.getsockname()[1])
        else:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            self.listener = socket.create_server((host, port), family=family, backlog=2048)
            self.listener.setblocking(False)
            self.port = int(self.listener.getsockname()[1])
        self.children: dict[int, Worker] = {}
        self.restarts = 0
        self._selector = selectors.DefaultSelector()
        self._accepting = False
        self._waiting: collections.deque[int] = collections.deque()
        """Accepted connections no worker could take yet (every channel full or none ready)."""
        self._stopping = False

    def _command(self, index: int, channel: int) -> list[str]:
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
            "--channel",
            str(channel),
            *(["--reuseport"] if self.balance == "reuseport" else []),
        ]

    def _spawn(self, index: int) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            process = subprocess.Popen(
                self._command(index, theirs.fileno()), cwd=Path.cwd(), pass_fds=(theirs.fileno(),)
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        worker = Worker(index, process, ours)
        self.children[index] = worker
        self._selector.register(ours, selectors.EVENT_READ, worker)

    def _forget(self, worker: Worker) -> None:
        """The worker is gone: its connections with it."""
        if worker.channel.fileno() >= 0:
            self._selector.unregister(worker.channel)
            worker.channel.close()
        worker.ready = False
        worker.open = 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stopping = True  # the loop stops accepting, then tells the workers

    def _stop(self) -> None:
        self._close_listener()
        for worker in self.children.values():
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)

    def _close_listener(self) -> None:
        if self.listener is not None:
            if self._accepting:
                self._selector.unregister(self.listener)
                self._accepting = False
            self.listener.close()
            self.listener = None
        while self._waiting:
            os.close(self._waiting.popleft())

    # --- the channels ----------------------------------------------------------------------------

    def _read(self, worker: Worker) -> None:
        while True:
            try:
                message = worker.channel.recv(8192)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                message = b""
            if not message:
                self._forget(worker)
                return
            if READY in message and not worker.ready:
                worker.ready = True
                log.info("switchyard: worker %d (pid %d) ready", worker.index, worker.process.pid)
            worker.open = max(0, worker.open - message.count(CLOSED))

    def _hand(self, conn: int) -> bool:
        """Give the connection (fd `conn`) to the ready worker with the fewest open connections; False if
        none could take it."""
        ready = sorted((w for w in self.children.values() if w.ready), key=lambda w: (w.open, w.handed))
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, conn.to_bytes(4, sys.byteorder, signed=True))]
        for worker in ready:
            try:
                worker.channel.sendmsg(_CONNECTION, rights)
            except (BlockingIOError, InterruptedError):
                continue  # its channel is full: the next one
            except OSError:
                self._forget(worker)
                continue
            worker.open += 1
            worker.handed += 1
            os.close(conn)  # the worker holds its own copy of the fd
            return True
        return False

    def _accept(self) -> None:
        for _ in range(ACCEPT_BURST):
            if self.listener is None:
                return
            try:
                sock, _addr = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # EMFILE and the like: the connection stays in the backlog
                log.warning("switchyard: accept failed: %s", exc)
                time.sleep(0.1)  # the listener stays readable: no busy loop
                return
            conn = sock.detach()  # the fd, closed once handed over
            if not self._hand(conn):
                self._waiting.append(conn)
                return

    def _step(self) -> None:
        while self._waiting and self._hand(self._waiting[0]):
            self._waiting.popleft()
        ready = any(w.ready for w in self.children.values())
        want = self.listener is not None and not self._waiting and ready
        if want and not self._accepting:
            assert self.listener is not None
            self._selector.register(self.listener, selectors.EVENT_READ, None)
            self._accepting = True
        elif not want and self._accepting:
            assert self.listener is not None
            self._selector.unregister(self.listener)
            self._accepting = False
        for key, _events in self._selector.select(timeout=0.05 if self._waiting else 0.1):
            if key.data is None:
                self._accept()
            else:
                self._read(key.data)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        for index in range(self.workers):
            self._spawn(index)
        log.info("switchyard: %d workers on %s:%d (%s)", self.workers, self.host, self.port, self.balance)
        last_check = 0.0
        while not self._stopping:
            self._step()
            if time.monotonic() - last_check < 0.1:
                continue
            last_check = time.monotonic()
            for index, worker in list(self.children.items()):
                code = worker.process.poll()
                if code is None or self._stopping:
                    continue
                self._forget(worker)
                if time.monotonic() - worker.started < RESTART_MIN_INTERVAL:
                    continue  # crashing at start: retry at most once a second
                log.warning(
                    "switchyard: worker %d (pid %d) exited (%s); restarting", index, worker.process.pid, code
                )
                self.restarts += 1
                self._spawn(index)
        self._stop()
        deadline = time.monotonic() + self.grace + 5
        for worker in self.children.values():
            try:
                worker.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            self._forget(worker)
        self._selector.close()
        if self._reserved is not None:
            self._reserved.close()
        return 0


def serve_workers(
    config: str,
    host: str,
    port: int,
    workers: int,
    log_level: str,
    grace: float,
    balance: Balance = "least_connections",
) -> int:
    return Supervisor(config, host, port, workers, log_level, grace, balance).run()


def _worker_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gateway.serve.workers")
    parser.add_argument("--config", required=True)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--channel", type=int, required=True, help="fd of this worker's hand-off channel")
    parser.add_argument("--reuseport", action="store_true", help="listen on host:port with SO_REUSEPORT too")
    args = parser.parse_args(argv)
    end_with_parent()
    if os.getppid() != args.parent:  # the parent died before prctl took effect
        return 1
    from gateway.config.settings import load_settings
    from gateway.serve.server import run_server

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("switchyard.access").setLevel(args.log_level.upper())
    settings = load_settings(args.config)
    channel = socket.socket(fileno=args.channel)
    sock = None
    if args.reuseport:
        sock = reuseport_socket(args.host, args.port)
        sock.listen(2048)
    run_server(settings, args.host, args.port, args.log_level, channel=channel, main_socket=sock)
    return 0


if __name__ == "__main__":
    raise SystemExit(_worker_main())
