"""`gateway.workers: 2` with the supervisor handing connections over (gateway/serve/workers.py), as real
processes: few keep-alive connections split evenly, the peer address and PROXY header reach the worker,
a killed worker is restarted and gets the new connections, SIGTERM drains, nothing is left behind.

Workers are told apart by `/ready`'s `fleet.replica` (each worker is a replica with its own id)."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from tests.support import ROOT, free_port

REDIS_URL = "redis://127.0.0.1:6379/0"


def _wait(check: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _children(parent: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(parent)], capture_output=True, text=True).stdout
    return {int(p) for p in out.split()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Conn:
    """One keep-alive HTTP/1.1 connection, optionally opened with a PROXY v1 header."""

    def __init__(self, port: int, preamble: bytes = b"") -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.preamble = preamble

    def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        request = f"GET {path} HTTP/1.1\r\nhost: gw\r\n\r\n".encode()
        self.sock.sendall(self.preamble + request)
        self.preamble = b""
        return self.get_response()

    def get_response(self) -> tuple[int, dict[str, str], bytes]:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                return 0, {}, data
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        while len(body) < int(headers.get("content-length", "0")):
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            body += chunk
        return int(lines[0].split()[1]), headers, body

    def replica(self) -> str:
        status, _, body = self.get("/ready")
        assert status in (200, 503), body  # 503: the one backend is down, which this does not need
        return str(json.loads(body)["fleet"]["replica"])

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def supervisor(tmp_path: Path, gateway: dict[str, Any]) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    prefix = f"test-handoff-{uuid.uuid4().hex[:8]}"
    config = {
        "gateway": {"port": port, "shutdown_grace": 3, **gateway},
        "ledger": {"redis_url": REDIS_URL, "key_prefix": prefix},
        "telemetry": {"access_log": {"enabled": False}},
        "pools": [
            {
                "name": "h100",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"name": "h100-a", "url": "http://127.0.0.1:9", "models": ["m"], "max_model_len": 64}
                ],
            }
        ],
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--workers", "2"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        _wait(lambda: len(_children(process.pid)) == 2, 10)
        workers = _children(process.pid)
        yield process, port
        workers |= _children(process.pid)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _wait(lambda: not any(_alive(pid) for pid in workers), 15)
        client = redis.Redis.from_url(REDIS_URL)
        names = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if names:
            client.delete(*names)
        client.close()


def _both_ready(port: int) -> None:
    """Both workers serve (each took a connection) and the probes' connections are closed again."""

    def two() -> bool:
        conns = [Conn(port) for _ in range(2)]
        try:
            return len({c.replica() for c in conns}) == 2
        except (OSError, AssertionError):
            return False
        finally:
            for c in conns:
                c.close()

    _wait(two, 30)
    time.sleep(0.3)  # the supervisor hears of the closes


def test_few_keep_alive_connections_split_evenly_and_a_killed_worker_gets_new_ones(tmp_path: Path) -> None:
    with supervisor(tmp_path, {}) as (process, port):
        _both_ready(port)
        conns = [Conn(port) for _ in range(8)]
        owners = [c.replica() for c in conns]
        split = collections.Counter(owners)
        assert sorted(split.values()) == [4, 4], split
        assert [c.replica() for c in conns] == owners  # a connection stays on its worker

        # closes are counted: close three of one worker's, the next three new connections go to it
        first = next(iter(split))
        closed = [c for c, owner in zip(conns, owners, strict=True) if owner == first][:3]
        for c in closed:
            c.close()
        time.sleep(0.3)
        fresh = [Conn(port) for _ in range(3)]
        assert [c.replica() for c in fresh] == [first] * 3

        for c in conns + fresh:
            if c not in closed:
                c.close()
        time.sleep(0.3)

        # a killed worker's connections die with it and its count starts again at 0: once restarted, it
        # takes every new connection until it holds as many as the survivor
        conns = [Conn(port) for _ in range(8)]
        owners = [c.replica() for c in conns]
        assert sorted(collections.Counter(owners).values()) == [4, 4], owners
        victim = min(_children(process.pid))
        survivor = next(o for o in owners if not o.endswith(f"-{victim}"))
        os.kill(victim, signal.SIGKILL)
        _wait(lambda: len(_children(process.pid)) == 2 and victim not in _children(process.pid), 10)
        (restarted,) = _children(process.pid) - {int(survivor.rsplit("-", 1)[1])}
        deadline = time.monotonic() + 30
        while True:  # until the new worker is ready, a probe lands on the survivor and is closed again
            assert time.monotonic() < deadline
            probe = Conn(port)
            if probe.replica() != survivor:
                break
            probe.close()
            time.sleep(0.3)
        fresh = [probe] + [Conn(port) for _ in range(3)]
        assert [c.replica() for c in fresh] == [fresh[0].replica()] * 4
        assert fresh[0].replica().endswith(f"-{restarted}")
        more = [Conn(port) for _ in range(2)]  # 4 and 4: one each
        assert sorted(c.replica() for c in more) == sorted([survivor, fresh[0].replica()])
        for c in conns + fresh + more:
            c.close()


def test_peer_address_and_proxy_header_reach_the_worker_and_caps_hold(tmp_path: Path) -> None:
    gateway = {
        "trusted_proxies": ["127.0.0.1"],
        "proxy_protocol": "required",
        "connections": {"max_per_client": 1},
    }
    with supervisor(tmp_path, gateway) as (_process, port):
        proxy = b"PROXY TCP4 203.0.113.7 127.0.0.1 40000 8080\r\n"

        def both_up() -> bool:
            conns = [Conn(port, proxy.replace(b".7 ", f".{10 + i} ".encode())) for i in range(2)]
            try:
                return len({c.replica() for c in conns}) == 2
            except (OSError, AssertionError):
                return False
            finally:
                for c in conns:
                    c.close()

        _wait(both_up, 30)
        time.sleep(0.3)
        # The trusted peer (127.0.0.1, the real peer address of the handed-over socket) must send the header.
        bare = Conn(port)
        status, _, body = bare.get("/ready")
        assert status == 400 and json.loads(body)["error"]["code"] == "proxy_header_required"
        bare.close()
        time.sleep(0.3)
        # One connection per client and worker: the least-loaded hand-off puts the 1st and 3rd connection
        # from 203.0.113.7 on one worker, which refuses the 3rd; the 2nd is on the other worker.
        conns = [Conn(port, proxy) for _ in range(3)]
        answers = [c.get("/ready") for c in conns]
        assert [a[0] for a in answers] == [503, 503, 429], [a[2] for a in answers]
        assert json.loads(answers[2][2])["error"]["code"] == "too_many_connections"
        for c in conns:
            c.close()


def test_sigterm_drains_a_request_in_flight_and_leaves_nothing(tmp_path: Path) -> None:
    with supervisor(tmp_path, {}) as (process, port):
        _both_ready(port)
        conn = Conn(port)
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
        head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\n"
        head += f"content-length: {len(body)}\r\n\r\n"
        conn.sock.sendall(head.encode() + body[:10])  # a request in flight: its body not all sent
        time.sleep(0.3)
        workers = _children(process.pid)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        with pytest.raises(OSError):  # the port accepts no more
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
        assert any(_alive(pid) for pid in workers)  # the one holding the request drains it
        conn.sock.sendall(body[10:])
        status, headers, answer = conn.get_response()
        assert status != 0 and headers.get("connection") == "close", answer  # served, then closed
        conn.close()
        assert process.wait(timeout=15) == 0
        _wait(lambda: not any(_alive(pid) for pid in workers), 5)


def test_reuseport_mode_still_serves_from_both_workers_and_stops(tmp_path: Path) -> None:
    with supervisor(tmp_path, {"worker_balance": "reuseport"}) as (process, port):
        seen: set[str] = set()
        deadline = time.monotonic() + 30
        while len(seen) < 2:  # the kernel's hash: new connections reach both workers sooner or later
            assert time.monotonic() < deadline, seen
            try:  # refused until a worker listens
                conn = Conn(port)
            except OSError:
                time.sleep(0.1)
                continue
            with contextlib.suppress(OSError, AssertionError):
                seen.add(conn.replica())
            conn.close()
        workers = _children(process.pid)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        _wait(lambda: not any(_alive(pid) for pid in workers), 5)


def test_admin_port_still_served_by_the_workers(tmp_path: Path) -> None:
    admin_port = free_port()
    with supervisor(tmp_path, {"admin_port": admin_port}) as (_process, port):
        _both_ready(port)
        admin, main = Conn(admin_port), Conn(port)
        assert admin.get("/admin/v1/costs")[0] != 404  # the admin API on the admin port
        assert admin.get("/v1/models")[0] == 404  # and not the OpenAI API
        assert main.get("/admin/v1/costs")[0] == 404  # the reverse on the main port (handed over)
        assert main.get("/v1/models")[0] == 200
        assert main.replica()
        admin.close()
        main.close()
