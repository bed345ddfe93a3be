"""One gateway in front of a small simulated fleet for the fuzz suite, with tight request bounds so that
whatever the fuzzers generate is cheap to serve.

Helpers check what every answer must satisfy: no 5xx that is the gateway's fault, errors in OpenAI's
shape, no ledger change for a refused request, no breaker opened by client input, bounded memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from backends.lifetime import die_with_parent
from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import parse_fleet_spec
from tests.support import ROOT, free_port

MODEL = "llama-3.1-8b"
FLEET = f"""
model: {MODEL}
max_model_len: 4096
groups:
  - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, price_per_gpu_hour: 2.9, ttft_ms: 1,
      tpot_ms: 0.2}}
  - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75, ttft_ms: 1,
      tpot_ms: 0.2}}
"""
MAX_BODY_BYTES = 65536
LIMITS = {
    "max_n": 2,
    "max_tokens": 8,
    "max_best_of": 2,
    "max_logprobs": 2,
    "max_messages": 16,
    "max_prompt_chars": 4000,
    "max_embedding_inputs": 4,
}
CONNECTIONS = {"header_timeout": 2.0, "body_timeout": 2.0, "keep_alive_timeout": 2.0, "max_per_client": 128}
ENDPOINTS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/admin/v1/explain",
]


@dataclass
class FuzzGateway:
    base_url: str
    port: int
    process: subprocess.Popen[bytes]
    workdir: Path
    rss_at_start_kb: int

    def rss_kb(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def requests_counted(self) -> int:
        data = httpx.get(self.base_url + "/admin/v1/usage?by=model", timeout=10).json()["data"]
        return sum(row["requests"] for row in data)

    def breakers(self) -> dict[str, str]:
        data = httpx.get(self.base_url + "/admin/v1/backends", timeout=10).json()["data"]
        return {row["name"]: row["breaker"] for row in data}


def _start(config: dict[str, Any], workdir: Path) -> tuple[subprocess.Popen[bytes], str, int]:
    port = free_port()
    config = {**config, "gateway": {**config.get("gateway", {}), "port": port}}
    path = workdir / "gateway.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    log = (workdir / "gateway.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--log-level", "warning"],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        assert process.poll() is None, (workdir / "gateway.log").read_text()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(base + "/ready", timeout=1).status_code == 200:
                return process, base, port
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def fuzz_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FuzzGateway]:
    workdir: Path = tmp_path_factory.mktemp("fuzz")
    spec = parse_fleet_spec(FLEET, "<fuzz fleet>")
    with Fleet(spec, log_dir=workdir) as fleet:
        config = fleet.gateway_config(
            max_body_bytes=MAX_BODY_BYTES,
            limits=LIMITS,
            connections=CONNECTIONS,
            timeouts={"connect": 1.0, "first_byte": 5.0, "between_chunks": 5.0},
        )
        config["telemetry"] = {"access_log": {"enabled": False}}
        process, base, port = _start(config, workdir)
        try:
            warm_up(base)
            gateway = FuzzGateway(base, port, process, workdir, 0)
            gateway.rss_at_start_kb = gateway.rss_kb()
            yield gateway
            # After the whole suite: no breaker opened by client input, memory back near the start.
            assert set(gateway.breakers().values()) == {"closed"}
            grown_kb = gateway.rss_kb() - gateway.rss_at_start_kb
            assert grown_kb < 10 * 1024, f"the gateway's RSS grew by {grown_kb} kB"
            log = (workdir / "gateway.log").read_text()
            assert "Traceback" not in log, log[-3000:]
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def warm_up(base: str) -> None:
    """A few ordinary requests first, so the RSS baseline includes warmed caches and pools."""
    with httpx.Client(base_url=base, timeout=10) as client:
        for _ in range(20):
            client.post(
                "/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            )
            client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "stream": True})
            client.post("/v1/embeddings", json={"model": MODEL, "input": "hi"})


def assert_openai_error(status: int, content_type: str, body: bytes) -> dict[str, Any]:
    """A client error in OpenAI's shape; a 5xx here would be the gateway's fault (the fleet is healthy)."""
    assert status < 500, (status, body[:500])
    assert content_type.startswith("application/json"), (status, content_type, body[:200])
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    return error


def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[int, dict[str, str], bytes] | None:
    """Send raw bytes; the first response (status, headers, body), or None if the gateway closed silently."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(data)
        received = b""
        try:
            while b"\r\n\r\n" not in received:
                chunk = sock.recv(65536)
                if not chunk:
                    return None if not received else _parse(received, sock)
                received += chunk
        except ConnectionResetError:
            return None if not received else _parse(received, sock)
        return _parse(received, sock)


def _parse(received: bytes, sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    head, _, body = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0") or 0)
    with contextlib.suppress(OSError):
        while len(body) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            body += chunk
    return int(lines[0].split()[1]), headers, body


def wait_for_count(gateway: FuzzGateway, expected: int, timeout: float = 3.0) -> None:
    """The ledger's request count reaches `expected` (streams settle just after their last byte) and stays."""
    deadline = time.monotonic() + timeout
    while (counted := gateway.requests_counted()) < expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counted == expected, f"{counted} requests counted, {expected} served"
