"""`make demo`: a simulated H100 + MI300X fleet, the gateway in front of it, and a burst of SDK traffic."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import httpx
import openai

from backends.lifetime import die_with_parent, exit_on_termination
from backends.sim.fleet import Fleet
from backends.sim.fleet_spec import DEMO_FLEET, load_fleet_spec

_PROMPTS = [
    "Summarise the difference between HBM3 on MI300X and H100 in one line.",
    "Write a haiku about continuous batching.",
    "What does a KV cache hold?",
    "Name three things an inference gateway measures.",
]


def _wait_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the gateway exited with code {process.returncode} before it was ready")
        with contextlib.suppress(OSError), opener.open(url + "/ready", timeout=1.0) as response:
            if response.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the gateway at {url} was not ready within {timeout:.0f} s")


# 7,017 tokens to the simulator: long-context by its counted size (balanced's mark is 6,000), within 8k
_DOCUMENT = "Quarterly capacity report. " + "The MI300X pool served long-context retrieval traffic. " * 700


def _chat(client: openai.OpenAI, model: str, prompt: str, **kwargs: Any) -> str:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": prompt}], **kwargs
    )
    if kwargs.get("stream"):
        for _chunk in raw.parse():
            pass
    else:
        raw.parse()
    return raw.headers["x-request-id"]


def _send_burst(client: openai.OpenAI, model: str, count: int) -> list[tuple[str, str]]:
    """Returns (request id, kind) per request: a mix that exercises every class of the balanced policy."""
    kinds = [
        ("interactive", lambda p: _chat(client, model, p, max_tokens=24, stream=True)),
        ("long-doc", lambda p: _chat(client, model, _DOCUMENT + p, max_tokens=32)),
        ("batch-n2", lambda p: _chat(client, model, p, max_tokens=16, n=2)),
        ("chat", lambda p: _chat(client, model, p, max_tokens=24)),
        ("priority", lambda p: _chat(client, model, p, max_tokens=16, metadata={"priority": "high"})),
        (
            "completion",
            lambda p: client.completions.with_raw_response.create(
                model=model, prompt=p, max_tokens=16
            ).headers["x-request-id"],
        ),
        (
            "embedding",
            lambda p: client.embeddings.with_raw_response.create(model=model, input=p).headers[
                "x-request-id"
            ],
        ),
    ]
    sent: list[tuple[str, str]] = []
    for i in range(count):
        kind, send = kinds[i % len(kinds)]
        sent.append((send(_PROMPTS[i % len(_PROMPTS)]), kind))
    return sent


def _print_report(base_url: str, sent: list[tuple[str, str]]) -> None:
    records = {
        r["request_id"]: r for r in httpx.get(f"{base_url}/admin/v1/requests?limit=1000").json()["data"]
    }
    print(
        f"\n{'request id':<29} {'kind':<11} {'class':<12} {'backend':<9} {'vendor':<7} {'gpu':<7} "
        f"{'in':>5} {'out':>5} {'cost USD':>12}"
    )
    for request_id, kind in sent:
        r = records.get(request_id)
        if r is None:
            print(f"{request_id:<29} {kind:<11} (not in the ledger)")
            continue
        print(
            f"{request_id:<29} {kind:<11} {r['request_class']:<12} {r['backend']:<9} {r['vendor']:<7} "
            f"{r['accelerator']:<7} {r['prompt_tokens']:>5} {r['completion_tokens']:>5} "
            f"{r['cost_usd']:>12.8f}"
        )
    totals = httpx.get(f"{base_url}/admin/v1/usage?by=vendor").json()["data"]
    print(f"\n{'vendor':<8} {'requests':>8} {'tokens':>8} {'cost USD':>12}")
    for t in totals:
        print(f"{t['name']:<8} {t['requests']:>8} {t['total_tokens']:>8} {t['cost_usd']:>12.8f}")
    costs = httpx.get(f"{base_url}/admin/v1/costs?by=backend&window=15m&format=text").text
    print("\n" + costs.rstrip())


def _port_taken(host: str, port: int) -> str | None:
    """Why the gateway could not listen on host:port, or None when it can (binds as uvicorn does)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def run_demo(port: int = 8080, exit_after_traffic: bool = False, requests: int = 14) -> int:
    taken = _port_taken("127.0.0.1", port)
    if taken is not None:
        print(
            f"switchyard demo: cannot serve on 127.0.0.1:{port}: {taken}. "
            "Stop what listens there or pick another port with --port.",
            file=sys.stderr,
        )
        return 1
    # SIGTERM or SIGHUP (a service manager, a container runtime, a CI timeout) ends the demo as
    # Ctrl-C does, through the clean-up below; the children also die with it on SIGKILL.
    with exit_on_termination():
        return _run(port, exit_after_traffic, requests)


def _run(port: int, exit_after_traffic: bool, requests: int) -> int:
    spec = load_fleet_spec(DEMO_FLEET)
    with tempfile.TemporaryDirectory(prefix="switchyard-demo-") as tmp, Fleet(spec, log_dir=tmp) as fleet:
        config = fleet.write_gateway_config(Path(tmp) / "gateway.yaml", port=port)
        print(f"fleet: {len(fleet.backends)} simulated backends; gateway config: {config}")
        for b in fleet.backends:
            print(f"  {b.name:<9} {b.vendor:<7} {b.accelerator:<7} {b.url}")
        # The demo's gateway is open and its report reads /admin without a key: an admin key from the
        # caller's shell (weak ones refuse to start) is not the demo's.
        env = {k: v for k, v in os.environ.items() if k != "SWITCHYARD_ADMIN_KEY"}
        gateway = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway.cli",
                "serve",
                "--config",
                str(config),
                "--log-level",
                "warning",
            ],
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),
            env=env,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base_url, gateway)
            print(f"gateway: {base_url}/v1 (OpenAI-compatible)")
            client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="demo-key", max_retries=0)
            sent = _send_burst(client, spec.model, requests)
            _print_report(base_url, sent)
            if exit_after_traffic:
                return 0
            print(f"\nserving on {base_url}/v1 — press Ctrl-C to stop")
            with contextlib.suppress(KeyboardInterrupt):
                gateway.wait()
            return 0
        finally:
            if gateway.poll() is None:
                gateway.send_signal(signal.SIGTERM)
                try:
                    gateway.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    gateway.kill()
