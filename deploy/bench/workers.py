"""Non-streaming requests per second through `switchyard serve --workers N`, for N in 1 and 2.

The backend is HAProxy answering a fixed chat completion (C, no Python in the way), the load generator
one Python process (aiohttp, a fixed number of connections), the ledger the local Redis. On a 2-core
machine the load generator takes most of one core, so 2 workers share the other one with it: the
figure bounds what a second worker can add there, not what N workers give on N free cores.

    .venv/bin/python deploy/bench/workers.py [--seconds 10] [--connections 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.cli.cluster import free_port  # noqa: E402

ANSWER = {
    "id": "chatcmpl-bench",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10},
}


def backend_config(port: int) -> str:
    body = json.dumps(ANSWER).replace('"', '\\"')
    return f"""global
  maxconn 4096
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
frontend vllm
  bind 127.0.0.1:{port}
  http-request return status 200 content-type application/json string "{body}"
"""


async def load(url: str, seconds: float, connections: int) -> tuple[int, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    done = errors = 0
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            nonlocal done, errors
            while time.monotonic() < deadline:
                async with session.post(url, json=body) as response:
                    await response.read()
                    if response.status == 200:
                        done += 1
                    else:
                        errors += 1

        await asyncio.gather(*(one() for _ in range(connections)))
    return done, errors


def measure(workers: int, seconds: float, connections: int, workdir: Path, backend_port: int) -> float:
    port = free_port()
    config = {
        "gateway": {"port": port, "workers": workers, "health": {"interval": 5}},
        "ledger": {
            "redis_url": "redis://127.0.0.1:6379/0",
            "key_prefix": f"bench-workers-{uuid.uuid4().hex[:8]}",
        },
        "telemetry": {"access_log": {"enabled": False}},
        "pools": [
            {
                "name": "p",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [
                    {"url": f"http://127.0.0.1:{backend_port}", "models": ["m"], "max_model_len": 4096}
                ],
            }
        ],
    }
    path = workdir / f"gateway-{workers}.yaml"
    path.write_text(yaml.safe_dump(config))
    gateway = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path), "--log-level", "warning"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        time.sleep(4 + 2 * workers)
        asyncio.run(load(url, 2, connections))  # warm-up
        done, errors = asyncio.run(load(url, seconds, connections))
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)
        import redis

        client = redis.Redis()
        prefix = config["ledger"]["key_prefix"]  # type: ignore[index]
        keys = list(client.scan_iter(match="{sy:" + prefix + "}:*"))
        if keys:
            client.delete(*keys)
    if errors:
        print(f"  {errors} errors", file=sys.stderr)
    return done / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        print("needs haproxy (make haproxy)", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        backend_port = free_port()
        (workdir / "backend.cfg").write_text(backend_config(backend_port))
        backend = subprocess.Popen([haproxy, "-db", "-f", str(workdir / "backend.cfg")])
        try:
            for round_ in range(args.rounds):
                for workers in (1, 2):
                    rate = measure(workers, args.seconds, args.connections, workdir, backend_port)
                    print(f"round {round_ + 1}: {workers} worker(s): {rate:,.0f} requests/s", flush=True)
        finally:
            backend.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                backend.wait(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
