"""What telemetry costs: gateway requests/s and CPU per request with telemetry off and on, in one run.

Gateways identical but for telemetry, pinned to the first CPU and loaded one at a time by wrk (64
connections) in alternating rounds, so drift on a shared machine hits all of them:

- `before`:  (only with `--baseline-ref REF`) the code at REF, exported to a temporary directory;
- `off`:     `telemetry: {metrics: false, access_log: {enabled: false}}` (tracing is off by default): what
             an operator who turns everything off pays; the reference of the ratios;
- `metrics+logs`: the defaults: `GET /metrics` cells and one JSON access-log line per request (to a file);
- `all`:     plus tracing of every request (`sample_ratio: 1`), spans built by the span-export child
             process and dropped there (`exporter: none`);
- `all+otlp`: the same, exported over OTLP/HTTP to a local sink process that decodes nothing and
             answers 200, so the real encoding cost is paid.

The span-export child does its work off the gateway's event loop; this benchmark pins it to the second
CPU (with wrk and the backend), as a deployment gives it a core of its own, and reports its CPU per
request separately: `gw CPU` is the gateway process alone, `export CPU` the child.

The backend is nginx answering a static chat completion (or, without nginx, a simulated backend with zero
token delays), so the gateway on its core is the bottleneck; it shares the second CPU with wrk. Reports
requests/s and CPU µs per request per mode (medians over rounds), and each mode's throughput ratio
against the reference (the median of each round's ratio, so drift between rounds cancels).

Usage: python -m loadtest.bench_telemetry [--duration 5] [--rounds 3] [--connections 64]
       [--baseline-ref REF] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from loadtest._bench_util import (
    ProcessGroup,
    assert_loopback,
    free_port,
    healthy,
    http_post,
    install_interrupt_handlers,
    pick_cpus,
    python_argv,
    session_cpu_seconds,
    start_zero_delay_backend,
    wait_until,
    which,
)
from loadtest.bench_accounting import _BODY, _WRK_SCRIPT, MODEL, _wrk
from loadtest.bench_http_clients import start_upstream

ROOT = Path(__file__).resolve().parents[1]
MODES = ("before", "off", "metrics+logs", "all", "all+otlp")
TRACED = ("all", "all+otlp")


def _telemetry(mode: str, workdir: Path, sink: str = "") -> dict[str, Any] | None:
    if mode == "before":
        return None  # the old config schema has no `telemetry` section
    if mode == "off":
        return {"metrics": False, "access_log": {"enabled": False}}
    on: dict[str, Any] = {"metrics": True, "access_log": {"destination": str(workdir / f"access-{mode}.log")}}
    if mode == "all":
        on["tracing"] = {"enabled": True, "exporter": "none"}
    if mode == "all+otlp":
        on["tracing"] = {"enabled": True, "exporter": "otlp", "endpoint": sink}
    return on


def _config(port: int, backend_url: str, mode: str, workdir: Path, sink: str = "") -> dict[str, Any]:
    config: dict[str, Any] = {
        "gateway": {"port": port},
        "ledger": {"store": "memory"},
        "pools": [
            {
                "name": "bench",
                "vendor": "nvidia",
                "accelerator": "h100",
                "price_per_gpu_hour": 2.9,
                "backends": [{"url": backend_url, "models": [MODEL], "max_model_len": 8192}],
            }
        ],
    }
    telemetry = _telemetry(mode, workdir, sink)
    if telemetry is not None:
        config["telemetry"] = telemetry
    return config


def _export(ref: str, into: Path) -> Path:
    """The tree at `ref`, exported (not checked out: the work tree is left alone)."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


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


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _export_child(gateway_pid: int, cpu: int) -> int:
    """The gateway's span-export child, moved to `cpu`."""
    deadline = time.monotonic() + 10
    while not (children := _children(gateway_pid)):
        if time.monotonic() > deadline:
            raise RuntimeError("the traced gateway has no span-export child")
        time.sleep(0.05)
    os.sched_setaffinity(children[0], {cpu})
    return children[0]


def run(duration: float, rounds: int, connections: int, baseline_ref: str | None) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    modes = MODES if baseline_ref else MODES[1:]
    reference = modes[0]
    proxy_cpu, load_cpu = pick_cpus()
    samples: dict[str, list[tuple[float, float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(_WRK_SCRIPT)
        group = ProcessGroup(work)
        try:
            if which(
                "nginx", "/usr/sbin", "/usr/local/sbin"
            ):  # static answers: the gateway is the bottleneck
                backend_url = start_upstream(group, "nginx", load_cpu, work).json_base
            else:
                backend_url = start_zero_delay_backend(group, MODEL, load_cpu)
            sink_port = free_port()
            sink_argv = [
                sys.executable,
                "-c",
                f"from loadtest.bench_telemetry import _serve_sink; _serve_sink({sink_port})",
            ]
            group.start("otlp-sink", sink_argv, cpu=load_cpu, cwd=str(ROOT))
            sink = f"http://127.0.0.1:{sink_port}/v1/traces"
            assert_loopback(sink)
            gateways: dict[str, tuple[str, int, int | None]] = {}
            for mode in modes:
                port = free_port()
                path = work / f"gateway-{mode}.yaml"
                path.write_text(yaml.safe_dump(_config(port, backend_url, mode, work, sink)))
                cwd = str(_export(baseline_ref, work / "before-tree")) if mode == "before" else str(ROOT)
                level = "warning" if mode in ("before", "off") else "info"
                child = group.start(
                    f"gateway-{mode}",
                    python_argv("gateway.cli", "serve", "--config", str(path), "--log-level", level),
                    cpu=proxy_cpu,
                    cwd=cwd,
                )
                url = f"http://127.0.0.1:{port}"
                assert_loopback(url)
                wait_until(lambda u=url: healthy(u), timeout=30, what=url, child=child)
                status, body = http_post(url + "/v1/chat/completions", _BODY.encode())
                if status != 200:
                    raise RuntimeError(f"{mode} gateway answered {status}: {body[:300]!r}")
                exporter = _export_child(child.pid, load_cpu) if mode in TRACED else None
                gateways[mode] = (url, child.pid, exporter)
            for url, _, _ in gateways.values():  # warm up
                _wrk(wrk, url + "/v1/chat/completions", script, connections, 1, load_cpu)
            for r in range(rounds):
                order = modes[r % len(modes) :] + modes[: r % len(modes)]
                for mode in order:
                    url, pid, exporter = gateways[mode]
                    cpu_before = session_cpu_seconds(pid)
                    export_before = _cpu_seconds(exporter) if exporter else 0.0
                    rps = _wrk(wrk, url + "/v1/chat/completions", script, connections, duration, load_cpu)
                    export = (_cpu_seconds(exporter) - export_before) if exporter else 0.0
                    cpu = session_cpu_seconds(pid) - cpu_before - export
                    done = max(1.0, rps * duration)
                    samples[mode].append((rps, cpu / done * 1e6, export / done * 1e6))
            logged = sum(
                len(p.read_bytes().splitlines()) for p in work.glob("access-*.log")
            )  # the lines were really written
        finally:
            group.close()
    summary: dict[str, Any] = {
        mode: {
            "rps": statistics.median(s[0] for s in samples[mode]),
            "cpu_us_per_req": statistics.median(s[1] for s in samples[mode]),
            "export_cpu_us_per_req": statistics.median(s[2] for s in samples[mode]),
            "rounds": [round(s[0]) for s in samples[mode]],
            "vs_" + reference: statistics.median(
                m[0] / b[0] for m, b in zip(samples[mode], samples[reference], strict=True)
            ),
        }
        for mode in modes
    }
    summary["reference"] = reference
    summary["access_log_lines"] = logged
    return summary


def format_table(summary: dict[str, Any]) -> str:
    ref = summary["reference"]
    modes = [m for m in MODES if m in summary]
    lines = [
        f"{'telemetry':<13} {'req/s':>8} {'vs ' + ref:>10} {'gw CPU µs/req':>14} {'export CPU µs/req':>18}"
        "  req/s per round"
    ]
    for mode in modes:
        s = summary[mode]
        lines.append(
            f"{mode:<13} {s['rps']:>8.0f} {s['vs_' + ref]:>10.3f} {s['cpu_us_per_req']:>14.0f} "
            f"{s['export_cpu_us_per_req']:>18.0f}  {s['rounds']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--baseline-ref", default="none", help="git ref for `before` (default: none)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.duration <= 120 or not 1 <= args.rounds <= 20 or not 1 <= args.connections <= 512:
        parser.error("--duration 1..120, --rounds 1..20, --connections 1..512")
    install_interrupt_handlers()
    ref = None if args.baseline_ref == "none" else args.baseline_ref
    summary = run(args.duration, args.rounds, args.connections, ref)
    print(format_table(summary))
    print(f"access-log lines written: {summary['access_log_lines']}")
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
