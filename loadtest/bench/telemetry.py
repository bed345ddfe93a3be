"""What telemetry costs: the gateway's throughput and CPU per request with telemetry off and on, in one run.

Modes, switched inside running gateway processes (loadtest/bench/switchable_gateway.py):

- `off`:     nothing wired: the per-request code of `telemetry: {metrics: false, access_log: {enabled:
             false}}` with tracing off (its default); the reference of the ratios;
- `off-twin`: `off` again under another name: its ratio is what "no difference" measures as in this run
             (the noise floor any other ratio must be read against);
- `metrics+logs`: the defaults: `GET /metrics` cells and one JSON access-log line per request (to a file);
- `all@10%`: plus tracing of one request in ten (`sample_ratio: 0.1`, what a busy production gateway
             would run), spans dropped by the span-export child;
- `all`:     plus tracing of every request (`sample_ratio: 1`), spans built by the span-export child
             process and dropped there (`exporter: none`);
- `all+otlp`: the same, exported over OTLP/HTTP to a local sink process that decodes nothing and
             answers 200, so the real encoding cost is paid.

How, and why so: on a shared machine speed drifts by tens of percent from one second to the next, and two
processes of identical code differ by several percent (hash seed, where their memory landed); either
would swamp a few percent of telemetry. So two gateway processes, A and B, share the first CPU and are
loaded at the same time, one wrk each (64 connections): the kernel gives each half the core, so their
throughputs compare their costs over the very same seconds. Each mode is measured in two phases, A in the
mode with B `off`, then the reverse, and the ratio is the geometric mean of the two (each process's own
speed cancels). `vs off` compares throughput, `cpu vs off` the gateway's CPU per request (off's over the
mode's); both are medians over rounds.

Placement: the gateways on the first CPU; wrk, the backend (nginx answering a static chat completion, or
without nginx a simulated backend with zero token delays) and the span-export children on the second,
as a deployment gives the exporter a core of its own. `gw CPU` is a gateway process alone, `export CPU`
its export children. With OTLP the exporter needs most of a core at this rate, so in `all+otlp` the
second CPU is nearly full and the load generator itself slows a little.

Usage: python -m loadtest.bench.telemetry [--duration 2] [--rounds 6] [--connections 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtest.bench._util import (
    assert_loopback,
    bench_pools,
    http_post,
    pick_cpus,
    process_cpu_seconds,
    python_argv,
    start_gateway,
    start_static_backend,
    which,
)
from loadtest.bench.accounting import _BODY, _WRK_SCRIPT, MODEL
from loadtest.bench.switchable_gateway import MODES
from loadtest.processes import ProcessGroup, free_port, install_interrupt_handlers

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = "off"


def _config(port: int, backend_url: str, access_log: Path) -> dict[str, Any]:
    """Everything on; the switchable gateway unwires what a mode leaves off."""
    return {
        "gateway": {"port": port},
        "ledger": {"store": "memory"},
        "pools": bench_pools(backend_url, MODEL),
        "telemetry": {
            "metrics": True,
            "access_log": {"destination": str(access_log)},
            "tracing": {"enabled": True, "exporter": "none"},
        },
    }


def _serve_sink(port: int) -> None:
    """An OTLP/HTTP endpoint that reads each POST and answers 200 (the `all+otlp` collector)."""
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def _export_children(gateway_pid: int, count: int) -> list[int]:
    """The gateway's span-export children (one per tracer), once all of them are up."""
    deadline = time.monotonic() + 15
    while len(children := _children(gateway_pid)) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway has {len(children)} span-export children, not {count}")
        time.sleep(0.05)
    return children


class _Gateway:
    def __init__(self, url: str, pid: int, exporters: list[int], mode_file: Path) -> None:
        self.url, self.pid, self.exporters, self.mode_file = url, pid, exporters, mode_file
        self.chat = url + "/v1/chat/completions"

    def cpu_seconds(self) -> tuple[float, float]:
        """CPU seconds used so far by the gateway process and by its span-export children."""
        return process_cpu_seconds(self.pid), sum(process_cpu_seconds(pid) for pid in self.exporters)

    def switch(self, mode: str) -> None:
        """Rewire for `mode`, then wait until the export children are idle (what the last mode shipped
        is exported before this one is measured, not on its time)."""
        self.mode_file.write_text(mode)
        os.kill(self.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        spent = -1.0
        while time.monotonic() < deadline:
            time.sleep(0.2)
            now = self.cpu_seconds()[1]
            if now == spent:
                return
            spent = now


def _start(
    group: ProcessGroup, work: Path, instance: int, backend_url: str, sink: str, cpus: tuple[int, int]
) -> _Gateway:
    proxy_cpu, load_cpu = cpus
    port = free_port()
    config = work / f"gateway-{instance}.yaml"
    config.write_text(yaml.safe_dump(_config(port, backend_url, work / f"access-{instance}.log")))
    mode_file = work / f"mode-{instance}"
    mode_file.write_text(REFERENCE)
    argv = python_argv(
        "loadtest.bench.switchable_gateway", "--config", str(config), "--port", str(port),
        "--mode-file", str(mode_file), "--otlp", sink,
    )  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": str(instance + 1)}
    url, child = start_gateway(
        group, f"gateway-{instance}", argv, port, proxy_cpu, cwd=str(ROOT), env=env, timeout=60
    )
    status, body = http_post(url + "/v1/chat/completions", _BODY.encode())
    if status != 200:
        raise RuntimeError(f"gateway answered {status}: {body[:300]!r}")
    exporters = _export_children(child.pid, 3)
    for pid in exporters:
        os.sched_setaffinity(pid, {load_cpu})
    return _Gateway(url, child.pid, exporters, mode_file)


def _wrk_pair(
    wrk: str, urls: tuple[str, str], script: Path, connections: int, duration: float, cpu: int
) -> tuple[float, float]:
    """Load both gateways at once, one wrk each; their requests/s."""
    argvs = [[wrk, "-t1", f"-c{connections}", f"-d{duration:g}s", "-s", str(script), url] for url in urls]
    procs = [
        subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        )
        for argv in argvs
    ]
    outs = [proc.communicate(timeout=duration + 30)[0] for proc in procs]
    rates = []
    for out in outs:
        match = re.search(r"Requests/sec:\s+([\d.]+)", out)
        if match is None or "Non-2xx or 3xx responses" in out:
            raise RuntimeError(f"wrk failed or saw errors:\n{out}")
        rates.append(float(match.group(1)))
    return rates[0], rates[1]


def _phase(
    gateways: tuple[_Gateway, _Gateway], modes: tuple[str, str], wrk: str, script: Path, connections: int,
    duration: float, load_cpu: int,
) -> list[tuple[float, float, float]]:  # fmt: skip
    """Both gateways loaded at once, each in its mode: (requests/s, CPU µs/request, export µs/request)."""
    for gateway, mode in zip(gateways, modes, strict=True):
        gateway.switch(mode)
    before = [gateway.cpu_seconds() for gateway in gateways]
    rates = _wrk_pair(wrk, (gateways[0].chat, gateways[1].chat), script, connections, duration, load_cpu)
    out = []
    for gateway, rps, (cpu0, export0) in zip(gateways, rates, before, strict=True):
        done = max(1.0, rps * duration)
        cpu, export = gateway.cpu_seconds()
        cpu, export = cpu - cpu0, export - export0
        out.append((rps, cpu / done * 1e6, export / done * 1e6))
    return out


def run(duration: float, rounds: int, connections: int) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    cpus = pick_cpus()
    load_cpu = cpus[1]
    measured = [m for m in MODES if m != REFERENCE]
    ratios: dict[str, list[tuple[float, float]]] = {m: [] for m in measured}
    costs: dict[str, list[tuple[float, float, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(_WRK_SCRIPT)
        group = ProcessGroup(work)
        try:
            backend_url = start_static_backend(group, MODEL, load_cpu, work)
            sink_port = free_port()
            sink_argv = [
                sys.executable,
                "-c",
                f"from loadtest.bench.telemetry import _serve_sink; _serve_sink({sink_port})",
            ]
            group.start("otlp-sink", sink_argv, cpu=load_cpu, cwd=str(ROOT))
            sink = f"http://127.0.0.1:{sink_port}/v1/traces"
            assert_loopback(sink)
            pair = (
                _start(group, work, 0, backend_url, sink, cpus),
                _start(group, work, 1, backend_url, sink, cpus),
            )
            for mode in MODES:  # warm up every mode in both
                _phase(pair, (mode, mode), wrk, script, connections, 1, load_cpu)
            for r in range(rounds):
                shift = r % len(measured)
                for mode in measured[shift:] + measured[:shift]:
                    # Each process takes the mode once and `off` once, so its own speed cancels out.
                    (a, b) = _phase(pair, (mode, REFERENCE), wrk, script, connections, duration, load_cpu)
                    (c, d) = _phase(pair, (REFERENCE, mode), wrk, script, connections, duration, load_cpu)
                    ratios[mode].append(
                        (math.sqrt(a[0] / b[0] * d[0] / c[0]), math.sqrt(b[1] / a[1] * c[1] / d[1]))
                    )
                    costs[mode] += [a, d]
                    costs[REFERENCE] += [b, c]
            logged = sum(len(p.read_bytes().splitlines()) for p in work.glob("access-*.log"))
        finally:
            group.close()
    summary: dict[str, Any] = {}
    for mode in MODES:
        summary[mode] = {
            "rps_sharing_the_core": statistics.median(c[0] for c in costs[mode]),
            "cpu_us_per_req": statistics.median(c[1] for c in costs[mode]),
            "export_cpu_us_per_req": statistics.median(c[2] for c in costs[mode]),
            "vs_off": statistics.median(r[0] for r in ratios[mode]) if mode != REFERENCE else 1.0,
            "cpu_vs_off": statistics.median(r[1] for r in ratios[mode]) if mode != REFERENCE else 1.0,
            "rounds_vs_off": [round(r[0], 3) for r in ratios.get(mode, [])],
        }
    summary["access_log_lines"] = logged  # the lines were really written
    return summary


def format_table(summary: dict[str, Any]) -> str:
    lines = [
        f"{'telemetry':<13} {'vs off':>7} {'cpu vs off':>11} {'gw CPU µs/req':>14} {'export CPU µs/req':>18}"
        f" {'req/s (half a core)':>20}  throughput vs off, per round"
    ]
    for mode in MODES:
        s = summary[mode]
        lines.append(
            f"{mode:<13} {s['vs_off']:>7.3f} {s['cpu_vs_off']:>11.3f} {s['cpu_us_per_req']:>14.0f} "
            f"{s['export_cpu_us_per_req']:>18.0f} {s['rps_sharing_the_core']:>20.0f}  {s['rounds_vs_off']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per mode and round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 100 or not 1 <= args.connections <= 512:
        parser.error("--duration 1..120, --rounds 1..100, --connections 1..512")
    install_interrupt_handlers()
    summary = run(args.duration, args.rounds, args.connections)
    print(format_table(summary))
    print(f"access-log lines written: {summary['access_log_lines']}")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
