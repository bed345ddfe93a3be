"""What a second worker buys: `gateway.workers: 2` against one worker, streamed answers in keys mode.

A 2-core machine that also runs wrk and the upstream cannot give two workers two free cores, so the
figure is computed from CPU time rather than read off a throughput: each phase loads gateways on one
core (wrk, 512-token streams as loadtest/bench/stream_chunks.py sends them) and reads the CPU time of every
process of their sessions from /proc (the supervisor and its workers). On two free cores the busier worker
sets the pace, so the raw projection of N workers over one at C connections is

    one(C) / (many(C)  x  N x the busier worker's share)

with one(C) and many(C) the CPU µs per answer of one worker and of N workers. That charges the workers
for sharing one core, which they would not do on N cores: two processes that take turns on a core
cost more per answer each (switches, cold caches) whatever they are. So each round also runs a control:
N separate one-worker gateways loaded at once on the same core with C/N connections each (control(C)),
and one of them alone with C/N connections (alone(C/N)): what a worker on a core of its own would cost.
The workers' own cost over N separate processes is many(C) / control(C), and the projection on N free
cores

    one(C) / (alone(C/N) x many(C) / control(C)  x  N x the busier worker's share)

which is N when the workers cost no more than separate processes, each with its share of the
connections, and share the load evenly (the default `gateway.worker_balance: least_connections` splits
connections evenly; `reuseport` spreads them by hash, so few connections may split unevenly). Phases
alternate and the figures are medians over rounds.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from loadtest.bench import stream_answers, stream_chunks
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


def _spent(child_pids: list[int], load: Any) -> tuple[float, dict[int, float]]:
    """Run `load()` (answers) and return them with the CPU seconds each process of the sessions spent."""
    before = [_cpu_by_process(pid) for pid in child_pids]
    answers = load()
    spent: dict[int, float] = {}
    for pid, was in zip(child_pids, before, strict=True):
        now = _cpu_by_process(pid)
        spent.update({p: now[p] - was.get(p, 0.0) for p in now})
    return answers, spent


def summarize(
    workers: int, share_c: int, per_answer: dict[str, list[float]], busiest: list[float]
) -> dict[str, Any]:
    """One connection count's figures from its rounds (module docstring: the two projections)."""
    one, many, alone, control = (
        statistics.median(per_answer[k]) for k in ("one", "many", "alone", "control")
    )
    share = statistics.median(busiest)
    return {
        "one_worker_us_per_answer": one,
        f"{workers}_workers_us_per_answer": many,
        "busiest_worker_share": share,
        "projected_scaling_raw": one / (many * share),
        f"alone_c{share_c}_us_per_answer": alone,
        f"{workers}_separate_us_per_answer": control,
        "workers_over_separate": many / control,
        "projected_scaling": one / (alone * many / control * share),
        "rounds": per_answer,
    }


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
            gateways: dict[str, tuple[str, Any]] = {}
            # "1": one worker; "N": `workers` workers; "1b", "1c"...: the control's other one-worker gateways
            names = ["1", "N"] + [f"1{chr(ord('a') + i)}" for i in range(1, workers)]
            for name in names:
                port = free_port()
                config = stream_chunks._config(port, upstreams, prefix)
                config["gateway"]["workers"] = workers if name == "N" else 1
                path = work / f"gateway-{name}.yaml"
                path.write_text(yaml.safe_dump(config))
                argv = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(path)]
                argv += ["--log-level", "warning"]
                gateways[name] = start_gateway(
                    group, f"gw-{name}", argv, port, gw_cpu, cwd=str(ROOT), timeout=60
                )
            script = work / "burst.lua"
            script.write_text(stream_answers.wrk_script(key, "burst"))
            size = {n: stream_answers.check_stream(url, key, "burst") for n, (url, _) in gateways.items()}
            separate = ["1", *names[2:]]

            def load(name: str, connections: int) -> float:
                url = gateways[name][0] + "/v1/chat/completions"
                return stream_chunks._wrk(wrk, url, script, connections, duration, load_cpu, size[name])

            def load_separate(connections: int) -> float:
                with ThreadPoolExecutor(len(separate)) as pool:
                    return sum(pool.map(lambda name: load(name, connections), separate))

            for c in conns:
                share_c = max(1, c // workers)
                per_answer: dict[str, list[float]] = {"one": [], "many": [], "alone": [], "control": []}
                busiest: list[float] = []
                phases: list[tuple[str, list[int], Any]] = [
                    ("one", [gateways["1"][1].pid], lambda c=c: load("1", c)),
                    ("many", [gateways["N"][1].pid], lambda c=c: load("N", c)),
                    ("alone", [gateways["1"][1].pid], lambda s=share_c: load("1", s)),
                    ("control", [gateways[n][1].pid for n in separate], lambda s=share_c: load_separate(s)),
                ]
                for r in range(rounds):
                    for phase, pids, run_load in phases if r % 2 == 0 else phases[::-1]:
                        answers, spent = _spent(pids, run_load)
                        per_answer[phase].append(sum(spent.values()) / max(answers, 1e-9) * 1e6)
                        if phase == "many":
                            worker_cpu = sorted(v for pid, v in spent.items() if pid != pids[0])
                            busiest.append(worker_cpu[-1] / max(sum(worker_cpu), 1e-9))
                results[f"c={c}"] = summarize(workers, share_c, per_answer, busiest)
        finally:
            group.close()
            delete_prefix(stream_chunks.REDIS_URL, prefix)
    return {"workers": workers, "tokens": stream_chunks.TOKENS, "cases": results}


def format_table(summary: dict[str, Any]) -> str:
    n = summary["workers"]
    lines = [
        f"{summary['tokens']}-token streams, keys mode; CPU µs per answer (all processes), median of rounds",
        f"{'case':<8} {'1 worker':>9} {f'{n} workers':>10} {'busiest':>8} {'raw':>6} "
        f"{'1 at C/N':>9} {f'{n} separate':>11} {'workers/separate':>17} {f'{n} cores vs 1':>13}",
    ]
    for case, c in summary["cases"].items():
        alone = next(v for k, v in c.items() if k.startswith("alone_"))
        lines.append(
            f"{case:<8} {c['one_worker_us_per_answer']:>9.0f} {c[f'{n}_workers_us_per_answer']:>10.0f} "
            f"{c['busiest_worker_share']:>8.3f} {c['projected_scaling_raw']:>5.2f}x {alone:>9.0f} "
            f"{c[f'{n}_separate_us_per_answer']:>11.0f} {c['workers_over_separate']:>17.3f} "
            f"{c['projected_scaling']:>12.2f}x"
        )
    lines.append("raw: one / (N workers x busiest share): the workers charged for taking turns on one core")
    lines.append("last: one / (1 at C/N x workers/separate x busiest share): a core for each worker")
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
