"""What a second worker buys: `gateway.workers: 2` against one worker, streamed answers in keys mode.

A 2-core machine that also runs wrk and the upstream cannot give two workers two free cores, so the
figure is computed from CPU time rather than read off a throughput: each phase loads one gateway alone
(wrk, 512-token streams as loadtest/bench/stream_chunks.py sends them) and reads the CPU time of every
process of its session from /proc (the supervisor and its workers). On two free cores the busier worker
sets the pace, so the projected throughput of N workers over one is

    (CPU µs per answer, one worker) / (CPU µs per answer, N workers  x  N x the busier worker's share)

which is N when the workers cost no more per answer than one process and share the load evenly (the
default `gateway.worker_balance: least_connections` splits connections evenly; `reuseport` spreads them by
hash, so few connections may split unevenly). Phases alternate and
the figures are medians over rounds.

Usage: python -m loadtest.bench.workers_scaling [--workers 2] [--rounds 5] [--duration 5]
       [--connections 64,8] [--tokens 512] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import yaml

from loadtest.bench import stream_chunks
from loadtest.bench._util import CLK_TCK, delete_prefix, pick_cpus, start_gateway, which
from loadtest.bench.peers_keys import _provision
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

ROOT = Path(__file__).resolve().parents[2]


def _cpu_by_process(sid: int) -> dict[int, float]:
    """CPU seconds (utime + stime) of every live process of session `sid`, by pid."""
    out: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rfind(")") + 2 :].split()
        if int(fields[3]) == sid:
            out[int(entry)] = (int(fields[11]) + int(fields[12])) / CLK_TCK
    return out


def run(workers: int, rounds: int, duration: float, conns: list[int]) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    gw_cpu, load_cpu = pick_cpus()
    prefix = "bench-workers-" + uuid.uuid4().hex[:8]
    key = "sy-bench-workers-" + uuid.uuid4().hex[:29]  # 43 characters after `sy-`, as real keys
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-workers-") as tmp:
        work = Path(tmp)
        group = ProcessGroup(work)
        try:
            upstreams = stream_chunks.start_nginx(group, work, load_cpu, 1.0)
            asyncio.run(_provision(key, prefix))
            gateways = {}
            for count in (1, workers):
                port = free_port()
                config = stream_chunks._config(port, upstreams, prefix)
                config["gateway"]["workers"] = count
                path = work / f"workers-{count}.yaml"
                path.write_text(yaml.safe_dump(config))
                argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
                argv += ["--log-level", "warning"]
                gateways[count] = start_gateway(
                    group, f"gw-{count}", argv, port, gw_cpu, cwd=str(ROOT), timeout=60
                )
            script = work / "burst.lua"
            script.write_text(stream_chunks._wrk_script(key, "burst"))
            size = {n: stream_chunks.check_stream(url, key, "burst") for n, (url, _) in gateways.items()}
            for c in conns:
                per_answer: dict[int, list[float]] = {n: [] for n in gateways}
                busiest: list[float] = []
                for r in range(rounds):
                    order = list(gateways) if r % 2 == 0 else list(gateways)[::-1]
                    for n in order:
                        url, child = gateways[n]
                        before = _cpu_by_process(child.pid)
                        answers = stream_chunks._wrk(
                            wrk, url + "/v1/chat/completions", script, c, duration, load_cpu, size[n]
                        )
                        after = _cpu_by_process(child.pid)
                        spent = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
                        total = sum(spent.values())
                        per_answer[n].append(total / max(answers, 1e-9) * 1e6)
                        if n == workers:
                            worker_cpu = sorted(v for pid, v in spent.items() if pid != child.pid)
                            busiest.append(worker_cpu[-1] / max(sum(worker_cpu), 1e-9))
                one, many = statistics.median(per_answer[1]), statistics.median(per_answer[workers])
                share = statistics.median(busiest)
                results[f"c={c}"] = {
                    "one_worker_us_per_answer": one,
                    f"{workers}_workers_us_per_answer": many,
                    "busiest_worker_share": share,
                    "projected_scaling": one / (many * share),
                }
        finally:
            group.close()
            delete_prefix(stream_chunks.REDIS_URL, prefix)
    return {"workers": workers, "tokens": stream_chunks.TOKENS, "cases": results}


def format_table(summary: dict[str, Any]) -> str:
    n = summary["workers"]
    lines = [
        f"{summary['tokens']}-token streams, keys mode; CPU µs per answer (all processes), median of rounds",
        f"{'case':<8} {'1 worker':>9} {f'{n} workers':>10} {'busiest share':>14} {f'{n} cores vs 1':>13}",
    ]
    for case, c in summary["cases"].items():
        lines.append(
            f"{case:<8} {c['one_worker_us_per_answer']:>9.0f} {c[f'{n}_workers_us_per_answer']:>10.0f} "
            f"{c['busiest_worker_share']:>14.3f} {c['projected_scaling']:>12.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", default="64,8")
    parser.add_argument("--tokens", type=int, default=stream_chunks.TOKENS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    conns = [int(c) for c in args.connections.split(",") if c]
    if not 2 <= args.workers <= 16 or not 1 <= args.rounds <= 50 or not 1 <= args.duration <= 120:
        parser.error("--workers 2..16, --rounds 1..50, --duration 1..120")
    if any(not 1 <= c <= 512 for c in conns) or not 1 <= args.tokens <= 8192:
        parser.error("--connections 1..512 each, --tokens 1..8192")
    stream_chunks.set_tokens(args.tokens)
    install_interrupt_handlers()
    summary = run(args.workers, args.rounds, args.duration, conns)
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
