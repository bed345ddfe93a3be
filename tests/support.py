"""Helpers shared by the test suites: free ports, a gateway subprocess, a recording backend, an aiohttp app
served for a block, a simulator of a calibrated profile timing one prompt."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import redis
import yaml
from aiohttp import web

from backends.calibrated import CalibratedProfile
from backends.lifetime import die_with_parent

ROOT = Path(__file__).resolve().parents[1]

ONE_POOL = """\
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 3
    backends:
      - {url: "http://127.0.0.1:8003", models: [m], max_model_len: 4096}
"""
"""The smallest config a settings test can load: one H100 pool of one backend (nothing listens there)."""


@contextlib.asynccontextmanager
async def serving(app: web.Application, shutdown_timeout: float = 60.0) -> AsyncIterator[str]:
    """`app` served on 127.0.0.1 (a port the kernel picks) for the block; its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def session_processes(session: int) -> dict[int, str]:
    """The live processes (not zombies) of session `session`, pid to name (`comm`: 15 characters at most):
    what a server started as a session's leader runs, its grandchildren included."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":  # the sixth field of stat: the session id
            found[int(entry.name)] = name
    return found


def kill_session(session: int) -> None:
    """SIGKILL what is left of session `session` (a failed test's leftovers)."""
    for pid in session_processes(session):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class ServerHolder:
    """A process standing in for what starts a server in the project (a bench, the launcher's caller):
    `script` run by this interpreter from the checkout, which starts a server leading a session of its
    own and prints that session's id. `holding_server` stops both, whatever the test did."""

    def __init__(self, script: str, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", script, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        self.session = 0

    def started(self) -> int:
        """The session id the script printed once its server was up (0: it exited first)."""
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        self.session = int(line) if line.strip() else 0
        return self.session

    def left_after_sigkill(self, timeout: float) -> dict[int, str]:
        """SIGKILL the holder and wait up to `timeout` seconds for the server's whole session to end: what
        still runs then (killed before returning)."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        deadline = time.monotonic() + timeout
        while (left := session_processes(self.session)) and time.monotonic() < deadline:
            time.sleep(0.05)
        kill_session(self.session)
        return left


@contextlib.contextmanager
def holding_server(script: str, *args: str) -> Iterator[ServerHolder]:
    holder = ServerHolder(script, *args)
    try:
        yield holder
    finally:
        if holder.process.poll() is None:
            holder.process.kill()
            holder.process.wait()
        if holder.session:
            kill_session(holder.session)  # what a failed test left


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port_block(count: int) -> int:
    """The first of `count` consecutive free ports, below the ephemeral range (32768 and up), so outgoing
    connections of other processes cannot take one of them between this check and their use."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20000, 32000 - count)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no block of {count} free ports found")


@contextlib.contextmanager
def running_gateway(
    config: dict[str, Any], workdir: Path, env: dict[str, str] | None = None
) -> Iterator[str]:
    """Start `switchyard serve` on a free port with `config`; yields its base URL."""
    port = free_port()
    config = {**config, "gateway": {**config.get("gateway", {}), "port": port}}
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = (workdir / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
        env={**os.environ, **(env or {})},
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"gateway exited early:\n{(workdir / 'gateway.log').read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("gateway did not start within 30 s")
            time.sleep(0.05)
        yield base
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@contextlib.contextmanager
def running_replicas(
    configs: Sequence[dict[str, Any]], workdirs: Sequence[Path], env: dict[str, str] | None = None
) -> Iterator[list[str]]:
    """One gateway per (config, workdir), as replicas sharing what their configs share (a Redis prefix);
    yields their base URLs, stops them all on exit."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(running_gateway(config, workdir, env=env))
            for config, workdir in zip(configs, workdirs, strict=True)
        ]


def clean_redis(prefix: str) -> None:
    """Delete the keys gateways wrote to the local Redis under ledger prefix `prefix` (`sy:`, `syt:`,
    `syr:`)."""
    client = redis.Redis()
    for pattern in (f"*syt:{prefix}*", f"*sy:{prefix}*", f"*syr:{prefix}*"):
        keys = list(client.scan_iter(match=pattern, count=1000))
        if keys:
            client.delete(*keys)
    client.close()


def two_pool_fleet(model: str, tpot_ms: float = 4) -> str:
    """A simulated fleet spec (`parse_fleet_spec`): one H100 and one MI300X serving `model`, fast enough
    for tests that need a real fleet but not its timing."""
    return f"""
model: {model}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.90, ttft_ms: 2,
      tpot_ms: {tpot_ms:g}}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75, ttft_ms: 2,
      tpot_ms: {tpot_ms:g}}}
"""


class RecordingBackend:
    """A minimal vLLM stand-in that records every request it receives and answers a fixed completion."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.requests: list[tuple[str, dict[str, str], dict[str, Any]]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, body: bytes, content_type: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply(200, b"{}")

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                outer.requests.append((self.path, dict(self.headers), body))
                answer = {
                    "id": "chatcmpl-rec",
                    "object": "chat.completion",
                    "created": 1,
                    "model": outer.model,
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "ok"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                }
                self._reply(200, json.dumps(answer).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RecordingBackend:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def sim_metrics(url: str) -> dict[str, float]:
    """A backend's /metrics as {series: value} (labels kept in the key)."""
    return parse_metrics(httpx.get(url + "/metrics").text)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {series: value} (labels kept in the key)."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def metric(values: dict[str, float], name: str, **labels: str) -> float:
    """Sum the series of `name` whose labels include `labels`."""
    total = 0.0
    for series, value in values.items():
        base = series.split("{", 1)[0]
        if base != name:
            continue
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += value
    return total


async def simulated_ttft(profile: CalibratedProfile, prompt_tokens: int) -> float:
    """The TTFT a simulator server of `profile` (20 times real time) reports in its own metrics for one
    completion of a `prompt_tokens` prompt, in simulated seconds."""
    from backends.sim.app import start_server
    from backends.sim.options import SimOptions
    from backends.sim.profiles import calibrated_hardware

    hardware = calibrated_hardware(profile)
    max_model_len = profile.limits.max_model_len
    options = SimOptions(
        models=(profile.model,), max_model_len=max_model_len, hardware=hardware, time_scale=20
    )
    server = await start_server(options)
    try:
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=30) as http:
            body = {"prompt": list(range(prompt_tokens)), "max_tokens": 3}
            assert (await http.post("/v1/completions", json=body)).status_code == 200
            text = (await http.get("/metrics")).text
    finally:
        await server.close()
    return metric(parse_metrics(text), "vllm:time_to_first_token_seconds_sum")
