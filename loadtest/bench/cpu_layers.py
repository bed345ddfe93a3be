"""Where a non-streamed request's CPU goes, layer by layer, at high and low concurrency (issue 38).

Four targets, each alone on the first CPU, loaded by wrk from the second (with the backend: nginx answering
a static chat completion), at each `--connections` count:

- `floor`: loadtest/bench/floor_proxy.py, uvloop and httptools relaying bytes: what serving and relaying
  alone cost in Python;
- `open`: the gateway in `auth.mode: open` (routing, accounting, telemetry, the hardened server);
- `keys`: the gateway in `auth.mode: keys`, a key and team with every limit set, on the shared Redis (the
  admission's round trip: one `limits.ADMIT` per turn of the event loop, whatever arrived in it);
- `vllm-router`: the Rust router, where the peers harness's `setup.sh` installed it (else left out).

Each figure is the target's CPU time over the requests it answered (gateway CPU µs per request, from
/proc), so it does not depend on how busy the second CPU was. Rounds alternate the targets' order; the
figures are medians. The differences between rows are what each layer costs: `open - floor` the gateway's
request path over a bare relay, `keys - open` the keys, limits and budgets; read at 8 connections against
64 they say what low concurrency adds to each.

Usage: python -m loadtest.bench.cpu_layers [--connections 64,8] [--rounds 3] [--duration 5] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from loadtest.bench._util import (
    delete_prefix,
    floor_argv,
    http_post,
    pick_cpus,
    process_cpu_seconds,
    run_wrk,
    start_gateway,
    start_static_backend,
    which,
)
from loadtest.bench.accounting import _BODY
from loadtest.bench.keys import REDIS_URL, _make_key, _script, _start
from loadtest.bench.peer_router import PEER, router_argv
from loadtest.processes import Child, ProcessGroup, free_port, install_interrupt_handlers

TARGETS = ("floor", "open", "keys", "vllm-router")


def _answers(url: str) -> bool:
    return http_post(url + "/v1/chat/completions", _BODY.encode(), timeout=2)[0] == 200


def run(connections: list[int], rounds: int, duration: float) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (make wrk)")
    router = PEER if os.access(PEER, os.X_OK) else None
    targets = [t for t in TARGETS if t != "vllm-router" or router is not None]
    gw_cpu, load_cpu = pick_cpus()
    prefix = "bench-layers-" + uuid.uuid4().hex[:8]
    figures: dict[str, dict[int, dict[str, list[float]]]] = {
        t: {c: {"rps": [], "p50_ms": [], "cpu_us": []} for c in connections} for t in targets
    }
    with tempfile.TemporaryDirectory(prefix="bench-layers-") as tmp:
        work = Path(tmp)
        group = ProcessGroup(work)
        try:
            backend_url = start_static_backend(group, "bench-model", load_cpu, work)

            def start(target: str, r: int) -> tuple[str, Child]:
                if target in ("open", "keys"):
                    return _start(group, work, f"{target}-{r}", target, backend_url, prefix, gw_cpu, r + 1)
                port = free_port()
                if target == "floor":
                    argv = floor_argv(port, backend_url)
                else:
                    assert router is not None
                    argv = router_argv(router, port, backend_url)
                return start_gateway(group, f"{target}-{r}", argv, port, gw_cpu, timeout=60, ready=_answers)

            script = work / "post.lua"  # with the key, made through a keys gateway's admin API
            key_url, key_child = _start(group, work, "key", "keys", backend_url, prefix, gw_cpu, 1)
            script.write_text(_script(_make_key(key_url)))
            group.stop(key_child)
            for r in range(rounds):
                order = targets if r % 2 == 0 else targets[::-1]
                for target in order:
                    url, child = start(target, r)
                    chat = url + "/v1/chat/completions"
                    run_wrk(
                        wrk, chat, script, max(connections), 1, load_cpu, refuse_socket_errors=True
                    )  # warm-up
                    for c in connections:
                        before = process_cpu_seconds(child.pid)
                        rps, p50 = run_wrk(
                            wrk, chat, script, c, duration, load_cpu, refuse_socket_errors=True
                        )
                        spent = process_cpu_seconds(child.pid) - before
                        row = figures[target][c]
                        row["rps"].append(rps)
                        row["p50_ms"].append(p50)
                        row["cpu_us"].append(spent / max(1.0, rps * duration) * 1e6)
                    group.stop(child)
        finally:
            group.close()
            delete_prefix(REDIS_URL, prefix)
    medians = {
        t: {str(c): {k: statistics.median(v) for k, v in figures[t][c].items()} for c in connections}
        for t in targets
    }
    return {"connections": connections, "rounds": rounds, "duration": duration, "medians": medians}


def format_table(summary: dict[str, Any]) -> str:
    medians = summary["medians"]
    lines = [f"{'target':<12} {'conn.':>5} {'req/s':>8} {'p50 ms':>7} {'CPU µs/req':>11}"]
    for target, by_conn in medians.items():
        for c, m in by_conn.items():
            lines.append(f"{target:<12} {c:>5} {m['rps']:>8.0f} {m['p50_ms']:>7.3f} {m['cpu_us']:>11.1f}")
    lines.append("what each layer costs, CPU µs per request:")
    for c in map(str, summary["connections"]):
        cpu = {t: medians[t][c]["cpu_us"] for t in medians}
        parts = [
            f"open - floor {cpu['open'] - cpu['floor']:.1f}",
            f"keys - open {cpu['keys'] - cpu['open']:.1f}",
        ]
        if "vllm-router" in cpu:
            parts.append(f"keys / vllm-router {cpu['keys'] / cpu['vllm-router']:.2f}x")
        lines.append(f"  at {c} connections: " + ", ".join(parts))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", default="64,8", help="wrk connection counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the targets (medians)")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per measurement")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    try:
        connections = [int(c) for c in args.connections.split(",")]
    except ValueError:
        parser.error("--connections: comma-separated whole numbers")
    if (
        not all(1 <= c <= 512 for c in connections)
        or not 1 <= args.rounds <= 50
        or not 1 <= args.duration <= 120
    ):
        parser.error("--connections 1..512 each, --rounds 1..50, --duration 1..120")
    install_interrupt_handlers()
    summary = run(connections, args.rounds, args.duration)
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
