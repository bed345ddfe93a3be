"""What a new connection costs with `gateway.workers: 2`: connection-per-request clients against source trees
side by side (e.g. SO_REUSEPORT workers on one tree, the supervisor handing connections over on another).

One client opens a connection, sends `GET /health` with `connection: close`, reads to EOF, and again,
`--requests` times per phase; phases alternate between the trees over `--rounds`. Reported per tree: the
median and p99 of the whole exchange (connect to EOF) and the CPU the supervisor process spent per
connection (the process `switchyard serve` runs in; with SO_REUSEPORT it does nothing per connection).

Usage: python -m loadtest.bench.workers_connect [--trees /path/a,/path/b] [--rounds 4] [--requests 2000]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from loadtest.bench._util import pick_cpus, process_cpu_seconds, start_gateway
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

ROOT = Path(__file__).resolve().parents[2]
REQUEST = b"GET /health HTTP/1.1\r\nhost: bench\r\nconnection: close\r\n\r\n"


def _config(port: int) -> dict[str, object]:
    return {
        "gateway": {"port": port, "workers": 2},
        "telemetry": {"access_log": {"enabled": False}},
        "pools": [
            {
                "name": "p",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 1.0,
                "backends": [
                    {"name": "b", "url": "http://127.0.0.1:9", "models": ["m"], "max_model_len": 64}
                ],
            }
        ],
    }


def _exchange(port: int) -> float:
    started = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(REQUEST)
        while sock.recv(65536):
            pass
    return time.perf_counter() - started


def run(trees: list[Path], rounds: int, requests: int) -> dict[str, dict[str, float]]:
    gw_cpu, _ = pick_cpus()
    times: dict[Path, list[float]] = {tree: [] for tree in trees}
    cpu: dict[Path, float] = dict.fromkeys(trees, 0.0)
    with tempfile.TemporaryDirectory(prefix="bench-connect-") as tmp:
        group = ProcessGroup(Path(tmp))
        try:
            gateways = {}
            for i, tree in enumerate(trees):
                port = free_port()
                path = Path(tmp) / f"gw-{i}.yaml"
                path.write_text(yaml.safe_dump(_config(port)))
                python = tree / ".venv" / "bin" / "python"
                argv = [str(python), "-m", "gateway.cli", "serve", "--config", str(path)]
                argv += ["--log-level", "warning"]
                _, child = start_gateway(group, f"gw-{i}", argv, port, gw_cpu, cwd=str(tree), timeout=60)
                gateways[tree] = (port, child)
            for port, _ in gateways.values():  # warm both workers up
                for _ in range(200):
                    _exchange(port)
            for r in range(rounds):
                for tree in trees if r % 2 == 0 else trees[::-1]:
                    port, child = gateways[tree]
                    before = process_cpu_seconds(child.pid)
                    times[tree] += [_exchange(port) for _ in range(requests)]
                    cpu[tree] += process_cpu_seconds(child.pid) - before
        finally:
            group.close()
    out = {}
    for tree in trees:
        ordered = sorted(times[tree])
        out[str(tree)] = {
            "p50_us": statistics.median(ordered) * 1e6,
            "p99_us": ordered[int(len(ordered) * 0.99)] * 1e6,
            "supervisor_cpu_us_per_connection": cpu[tree] / len(ordered) * 1e6,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trees", default=str(ROOT))
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.trees.split(",") if t]
    if not 1 <= args.rounds <= 50 or not 10 <= args.requests <= 100_000:
        parser.error("--rounds 1..50, --requests 10..100000")
    install_interrupt_handlers()
    results = run(trees, args.rounds, args.requests)
    print(f"{'tree':<40} {'p50 µs':>8} {'p99 µs':>8} {'supervisor CPU µs/conn':>23}")
    for tree, r in results.items():
        per_connection = r["supervisor_cpu_us_per_connection"]
        print(f"{tree:<40} {r['p50_us']:>8.0f} {r['p99_us']:>8.0f} {per_connection:>23.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
