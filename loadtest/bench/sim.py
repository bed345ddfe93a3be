"""How many short requests per second one simulated backend sustains on one core.

Starts one `python -m backends.sim` pinned to the first CPU (`os.sched_setaffinity` before exec), pins
this load generator to the second, and sends short chat requests (16 output tokens, non-streaming and
streaming) over loopback at a fixed concurrency, each run bounded by a request count and a duration.
Two engines are measured: fixed timing with zero delays (the server's own HTTP and text work) and the
H100 performance model with a 1000x clock (adds the scheduler loop; the batch is the concurrency).
Reports requests/s, p50 latency (real ms), the server's CPU time per request and the request rate that
CPU time allows on a saturated core (on a 2-core machine the load generator's core usually saturates
first, so measured requests/s is a floor and the core-bound figure the backend's own limit).

Usage: python -m loadtest.bench.sim [--requests 3000] [--duration 10] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import aiohttp

from loadtest.bench._util import assert_loopback, healthy, pick_cpus, python_argv, session_cpu_seconds
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers, wait_until

MODEL = "llama-3.1-8b"
ENGINES: dict[str, list[str]] = {
    "fixed 0 ms": ["--ttft-ms", "0", "--tpot-ms", "0"],
    "h100 model x1000": ["--gpu", "h100-sxm5", "--time-scale", "1000"],
}


@dataclass
class Result:
    engine: str
    mode: str
    requests: int
    errors: int
    seconds: float
    p50_ms: float
    cpu_us_per_request: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _body(stream: bool) -> bytes:
    body: dict[str, object] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Say something short about GPUs."}],
        "max_tokens": 16,
    }
    if stream:
        body["stream"] = True
    return json.dumps(body).encode()


async def _load(
    url: str, stream: bool, requests: int, duration: float, concurrency: int
) -> tuple[int, int, list[float], float]:
    body = _body(stream)
    latencies: list[float] = []
    errors = 0
    issued = 0
    deadline = time.monotonic() + duration
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(
        connector=connector, headers={"Content-Type": "application/json"}
    ) as session:

        async def worker() -> None:
            nonlocal issued, errors
            while issued < requests and time.monotonic() < deadline:
                issued += 1
                started = time.perf_counter()
                try:
                    async with session.post(f"{url}/v1/chat/completions", data=body) as response:
                        await response.read()
                        ok = response.status == 200
                except aiohttp.ClientError:
                    ok = False
                if ok:
                    latencies.append(time.perf_counter() - started)
                else:
                    errors += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return len(latencies), errors, latencies, elapsed


def run(args: argparse.Namespace) -> list[Result]:
    server_cpu, load_cpu = pick_cpus()
    os.sched_setaffinity(0, {load_cpu})
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="bench-sim-") as tmp:
        group = ProcessGroup(Path(tmp))
        try:
            for engine, flags in ENGINES.items():
                port = free_port()
                url = f"http://127.0.0.1:{port}"
                assert_loopback(url)
                argv = python_argv("backends.sim", "--port", str(port), "--model", MODEL, *flags)
                child = group.start(engine.split()[0], argv, cpu=server_cpu)
                wait_until(partial(healthy, url), timeout=20, what=engine, child=child)
                for mode in ("json", "stream"):
                    asyncio.run(
                        _load(url, mode == "stream", min(200, args.requests), 2.0, args.concurrency)
                    )  # warm up
                    cpu_before = session_cpu_seconds(child.pid)
                    done, errors, latencies, elapsed = asyncio.run(
                        _load(url, mode == "stream", args.requests, args.duration, args.concurrency)
                    )
                    cpu = session_cpu_seconds(child.pid) - cpu_before
                    results.append(
                        Result(
                            engine=engine,
                            mode=mode,
                            requests=done,
                            errors=errors,
                            seconds=elapsed,
                            p50_ms=statistics.median(latencies) * 1e3 if latencies else float("nan"),
                            cpu_us_per_request=cpu / done * 1e6 if done else float("nan"),
                        )
                    )
                group.stop(child)
        finally:
            group.close()
    return results


def print_table(results: list[Result], concurrency: int) -> None:
    """A Markdown table; `core-bound req/s` = 1 s / server CPU per request (a saturated core)."""
    print(
        f"\none simulated backend pinned to one core; {concurrency} concurrent clients; 16-token chat replies"
    )
    header = ("engine", "mode", "requests", "errors", "req/s", "p50 ms", "CPU µs/req", "core-bound req/s")
    print("| " + " | ".join(header) + " |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        ceiling = 1e6 / r.cpu_us_per_request if r.cpu_us_per_request else float("nan")
        cells = (r.engine, r.mode, str(r.requests), str(r.errors), f"{r.rps:,.0f}", f"{r.p50_ms:.1f}")
        print("| " + " | ".join(cells) + f" | {r.cpu_us_per_request:,.0f} | {ceiling:,.0f} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.bench.sim", description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="at most this many requests per run")
    parser.add_argument("--duration", type=float, default=10.0, help="at most this many seconds per run")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args(argv)
    if args.requests < 1 or not 0 < args.duration <= 120 or not 1 <= args.concurrency <= 512:
        parser.error("--requests >= 1, 0 < --duration <= 120, 1 <= --concurrency <= 512")
    install_interrupt_handlers()
    print_table(run(args), args.concurrency)
    return 0


if __name__ == "__main__":
    sys.exit(main())
