"""Gateway CPU per streamed chunk: 512-token answers through this tree's gateway and a baseline commit's.

Both gateways run in `auth.mode: keys` (a key and a team with RPM, TPM, parallel and budget limits the
load never reaches, so every check runs), with the ledger and metrics on, pinned to the first CPU; nginx
(with its echo module) streams each answer as vLLM's server shapes it (a role chunk, one
`chat.completion.chunk` per token, the usage chunk, `data: [DONE]`, chunked transfer encoding) from the
second CPU, where wrk runs too. Two upstream shapes: `burst` writes the answer in ~3.5 KB pieces at once
(as the peers harness's mock does), `paced` flushes every event and sleeps `--paced-ms` between them (a
decoding backend), so each token reaches the gateway in a read of its own. `json` is the same answer not
streamed (a chat.completion with usage), for the CPU per non-streamed answer.

The machine may be shared, so throughput is not the figure: each phase loads one gateway alone with wrk
and divides the gateway process's CPU time (utime + stime from /proc) by the chunks it relayed (answers
x 512). Phases alternate old/new (and which goes first, round by round); the figure is the median over
rounds, and `new/old` the median of the per-round ratios; a last table gives each target's user time alone
per chunk (utime: the rest is the kernel's). When the peers harness installed vllm-router
(the harness's `setup.sh`, under /tmp/peers-venvs), it is measured in the same rounds as a third target,
started as the harness's `vllm-router` preset (default policy) with one router per upstream shape, all
pinned to the gateway's CPU (its CPU is its whole session's, every thread); `new/peer` and `old/peer` are
the medians of the per-round ratios. `--peer ''` leaves it out.

The floor, loadtest/bench/floor_proxy.py (uvloop and httptools writing each read from the backend to the
client as it came, nothing else), is a fourth target in the same rounds, one per upstream shape on the
gateway's CPU: `floor/peer` says what a Python relay costs per chunk before it does any of the gateway's
work, against the Rust router; `new/floor` what the gateway adds to it. `--no-floor` leaves it out.

Usage: python -m loadtest.bench.stream_chunks [--baseline REF] [--rounds 5] [--duration 5]
       [--connections 64,8] [--shapes burst,paced,json] [--tokens 512] [--json out.json]
       [--peer /tmp/peers-venvs/vllm-router/bin/vllm-router] [--no-floor]
       (make bench-stream-chunks ARGS=...; needs wrk, nginx and its echo module, Redis)
REF defaults to `main`; the baseline runs from `git archive REF` in a temporary directory.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import uuid
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from typing import Any

import yaml

from loadtest.bench import stream_upstream
from loadtest.bench._util import (
    delete_prefix,
    floor_argv,
    pick_cpus,
    process_cpu_split,
    session_cpu_split,
    start_gateway,
    start_per_shape,
    which,
)
from loadtest.bench.peer_router import PEER, start_peers
from loadtest.bench.peers_keys import _provision
from loadtest.bench.stream_answers import check_stream, wrk_script
from loadtest.bench.stream_upstream import MODEL, TOKENS, start_nginx
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

ROOT = Path(__file__).resolve().parents[2]
REDIS_URL = "redis://127.0.0.1:6379/0"


def _config(port: int, upstreams: dict[str, str], prefix: str) -> dict[str, Any]:
    return {
        "gateway": {"port": port, "max_connections_per_backend": 256},
        "ledger": {"store": "memory", "key_prefix": prefix},
        "auth": {"mode": "keys", "store": "redis", "redis_url": REDIS_URL, "replicas": 3},
        "telemetry": {"metrics": True, "access_log": {"enabled": False}},
        "pools": [
            {
                "name": f"mock-{shape}",
                "vendor": "amd",
                "accelerator": "mi300x",
                "price_per_gpu_hour": 1.75,
                "backends": [{"url": url, "models": [f"{MODEL}-{shape}"], "max_model_len": 4096}],
            }
            for shape, url in upstreams.items()
        ],
    }


def _wrk(
    wrk: str, url: str, script: Path, connections: int, duration: float, cpu: int, answer_bytes: int
) -> float:
    """Answers relayed in one wrk run, counting the part of a stream cut by its end (fails on any error)."""
    argv = [wrk, "-t1", f"-c{connections}", f"-d{duration:g}s", "--timeout", "30s", "-s", str(script), url]
    out = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=duration + 60,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
    ).stdout
    match = re.search(r"^BYTES (\d+)$", out, re.MULTILINE)
    if match is None or "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk failed or saw errors:\n{out}")
    return int(match.group(1)) / answer_bytes


def _baseline_tree(ref: str, work: Path) -> Path:
    tree = work / "baseline"
    tree.mkdir()
    archive = subprocess.run(["git", "archive", ref], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _answers(url: str, key: str, shape: str) -> bool:
    try:
        check_stream(url, key, shape)
    except (OSError, RuntimeError, ValueError):
        return False
    return True


def run(
    ref: str,
    rounds: int,
    duration: float,
    conns: list[int],
    shapes: list[str],
    paced_ms: float,
    peer: str | None = None,
    floor: bool = True,
) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    gw_cpu, load_cpu = pick_cpus()
    prefix = "bench-chunks-" + uuid.uuid4().hex[:8]
    key = "sy-bench-chunks-" + uuid.uuid4().hex[:30]  # 43 characters after `sy-`, as real keys
    samples: dict[str, dict[str, list[float]]] = {}
    ratios: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-chunks-") as tmp:
        work = Path(tmp)
        group = ProcessGroup(work)
        try:
            trees = {"old": _baseline_tree(ref, work), "new": ROOT}
            upstreams = start_nginx(group, work, load_cpu, paced_ms)
            asyncio.run(_provision(key, prefix))
            gateways = {}
            for name, tree in trees.items():
                port = free_port()
                path = work / f"{name}.yaml"
                path.write_text(yaml.safe_dump(_config(port, upstreams, prefix)))
                argv = [
                    sys.executable,
                    "-m",
                    "gateway.cli",
                    "serve",
                    "--config",
                    str(path),
                    "--log-level",
                    "warning",
                ]
                env = {**os.environ, "PYTHONPATH": str(tree)}
                gateways[name] = start_gateway(
                    group, f"gw-{name}", argv, port, gw_cpu, cwd=str(tree), env=env, timeout=60
                )

            def relays(url: str, shape: str) -> bool:
                return _answers(url, key, shape)

            peers = start_peers(group, peer, upstreams, shapes, relays, gw_cpu) if peer else {}
            floors = {}
            if floor:
                floors = start_per_shape(group, "floor", floor_argv, upstreams, shapes, relays, gw_cpu)
            for shape in shapes:
                script = work / f"{shape}.lua"
                script.write_text(wrk_script(key, shape))
                targets = dict(gateways)
                cpu_of: dict[str, Callable[[int], tuple[float, float]]] = dict.fromkeys(
                    gateways, process_cpu_split
                )
                if shape in peers:
                    targets["peer"] = peers[shape]
                    cpu_of["peer"] = session_cpu_split  # the router's threads, in its own session
                if shape in floors:
                    targets["floor"] = floors[shape]
                    cpu_of["floor"] = process_cpu_split
                size = {}
                for name, (url, _) in targets.items():
                    size[name] = check_stream(url, key, shape)
                    _wrk(wrk, url + "/v1/chat/completions", script, 8, 1, load_cpu, size[name])  # warm-up
                for c in conns:
                    case = f"{shape} c={c}"
                    samples[case] = {f"{n}{k}": [] for n in targets for k in ("", "_user", "_rps")}
                    ratios[case] = {f"new/{n}": [] for n in targets if n != "new"}
                    if "peer" in targets:
                        ratios[case]["old/peer"] = []
                        if "floor" in targets:
                            ratios[case]["floor/peer"] = []
                    names = list(targets)
                    for r in range(rounds):
                        order = names[r % len(names) :] + names[: r % len(names)]
                        if r % 2:
                            order.reverse()
                        per_chunk = {}
                        for name in order:
                            url, child = targets[name]
                            user_before, system_before = cpu_of[name](child.pid)
                            answers = _wrk(
                                wrk, url + "/v1/chat/completions", script, c, duration, load_cpu, size[name]
                            )
                            user_after, system_after = cpu_of[name](child.pid)
                            user = (user_after - user_before) / max(1e-9, answers) * 1e6  # per answer
                            system = (system_after - system_before) / max(1e-9, answers) * 1e6
                            per_chunk[name] = user + system
                            samples[case][name].append(per_chunk[name])
                            samples[case][f"{name}_user"].append(user)
                            samples[case][f"{name}_rps"].append(answers / duration)
                        for pair, values in ratios[case].items():
                            a, b = pair.split("/")
                            values.append(per_chunk[a] / per_chunk[b])
        finally:
            group.close()
            delete_prefix(REDIS_URL, prefix)
    cases: dict[str, dict[str, Any]] = {}
    for case, s in samples.items():
        cases[case] = {
            f"{name}_us_per_answer": statistics.median(values)
            for name, values in s.items()
            if not name.endswith("_rps")
        }
        cases[case].update(
            {
                f"{name.removesuffix('_rps')}_answers_per_s": statistics.median(v)
                for name, v in s.items()
                if name.endswith("_rps")
            }
        )
        for pair, values in ratios[case].items():
            key_name = pair.replace("/", "_vs_")
            cases[case][key_name] = statistics.median(values)
            cases[case][f"rounds_{key_name}"] = [round(x, 3) for x in values]
    return {"baseline": ref, "tokens": TOKENS, "peer": peer, "cases": cases}


def format_table(summary: dict[str, Any]) -> str:
    tokens = summary["tokens"]
    lines = [
        f"{tokens}-token answers, keys mode; gateway CPU µs per answer and per streamed chunk "
        f"(median of rounds), old = {summary['baseline']}",
        f"{'case':<14} {'old µs/ans':>11} {'new µs/ans':>11} {'old µs/ch':>10} {'new µs/ch':>10} "
        f"{'new/old':>8}  rounds",
    ]
    for case, c in summary["cases"].items():
        old, new = c["old_us_per_answer"], c["new_us_per_answer"]
        chunks = "" if case.startswith("json") else f"{old / tokens:>10.2f} {new / tokens:>10.2f}"
        lines.append(
            f"{case:<14} {old:>11.0f} {new:>11.0f} {chunks:>21} {c['new_vs_old']:>8.3f}  "
            f"{c['rounds_new_vs_old']}"
        )
    peer_cases = {case: c for case, c in summary["cases"].items() if "peer_us_per_answer" in c}
    if peer_cases:
        lines.append(f"vllm-router in the same rounds ({summary['peer']}); answers/s per target")
        lines.append(
            f"{'case':<14} {'peer µs/ans':>11} {'peer µs/ch':>10} {'new/peer':>8} {'old/peer':>8} "
            f"{'old/s':>7} {'new/s':>7} {'peer/s':>7}  rounds new/peer"
        )
        for case, c in peer_cases.items():
            peer = c["peer_us_per_answer"]
            per_chunk = "" if case.startswith("json") else f"{peer / tokens:.2f}"
            lines.append(
                f"{case:<14} {peer:>11.0f} {per_chunk:>10} {c['new_vs_peer']:>8.3f} {c['old_vs_peer']:>8.3f} "
                f"{c['old_answers_per_s']:>7.0f} {c['new_answers_per_s']:>7.0f} "
                f"{c['peer_answers_per_s']:>7.0f}  {c['rounds_new_vs_peer']}"
            )
    floor_cases = {case: c for case, c in summary["cases"].items() if "floor_us_per_answer" in c}
    if floor_cases:
        lines.append("the floor (a bare Python relay, loadtest/bench/floor_proxy.py) in the same rounds")
        lines.append(
            f"{'case':<14} {'floor µs/ans':>12} {'floor µs/ch':>11} {'new/floor':>9} {'floor/peer':>10}"
        )
        for case, c in floor_cases.items():
            floor = c["floor_us_per_answer"]
            per_chunk = "" if case.startswith("json") else f"{floor / tokens:.2f}"
            versus_peer = f"{c['floor_vs_peer']:.3f}" if "floor_vs_peer" in c else "-"
            lines.append(
                f"{case:<14} {floor:>12.0f} {per_chunk:>11} {c['new_vs_floor']:>9.3f} {versus_peer:>10}"
            )
    streamed = [(case, c) for case, c in summary["cases"].items() if not case.startswith("json")]
    names = [
        n for n in ("old", "new", "peer", "floor") if streamed and f"{n}_user_us_per_answer" in streamed[0][1]
    ]
    if names:  # a summary written before the split was recorded has none
        lines.append("user-space CPU µs per chunk (the rest of each figure above is the kernel's)")
        lines.append(f"{'case':<14} " + " ".join(f"{n + ' user':>11}" for n in names))
        for case, c in streamed:
            users = [c.get(f"{n}_user_us_per_answer", float("nan")) / tokens for n in names]
            lines.append(f"{case:<14} " + " ".join(f"{u:>11.2f}" for u in users))
    return "\n".join(lines)


def set_tokens(tokens: int) -> None:
    """Tokens per answer: what nginx serves (`stream_upstream`) and what the checks expect (here)."""
    global TOKENS
    TOKENS = stream_upstream.TOKENS = tokens


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", default="main", help="git ref of the baseline gateway (default main)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of load per phase")
    parser.add_argument("--connections", default="64,8")
    parser.add_argument("--shapes", default="burst,paced,json")
    parser.add_argument("--tokens", type=int, default=TOKENS, help="tokens per answer (the peers mock: 64)")
    parser.add_argument("--paced-ms", type=float, default=1.0, help="pause between events, paced shape")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--peer",
        default=PEER,
        help="vllm-router executable measured in the same rounds ('' to leave it out; "
        "left out with a note when it is not installed)",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="leave out the floor (loadtest/bench/floor_proxy.py)"
    )
    args = parser.parse_args(argv)
    conns = [int(c) for c in args.connections.split(",") if c]
    shapes = [s for s in args.shapes.split(",") if s]
    if not 1 <= args.rounds <= 50 or not 1 <= args.duration <= 120 or any(not 1 <= c <= 512 for c in conns):
        parser.error("--rounds 1..50, --duration 1..120, --connections 1..512")
    if any(s not in ("burst", "paced", "json") for s in shapes):
        parser.error("--shapes: burst, paced and/or json")
    if not 1 <= args.tokens <= 8192:
        parser.error("--tokens 1..8192")
    set_tokens(args.tokens)
    install_interrupt_handlers()
    peer = args.peer or None
    if peer is not None and not os.access(peer, os.X_OK):
        print(f"no vllm-router at {peer} (the peers harness's setup.sh installs it): measured without it")
        peer = None
    summary = run(
        args.baseline, args.rounds, args.duration, conns, shapes, args.paced_ms, peer, not args.no_floor
    )
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
