"""What telemetry costs: gateway requests/s and CPU per request with telemetry off and on, in one run.

Four gateways, identical but for telemetry, pinned to the first CPU and loaded one at a time by wrk (64
connections) in alternating rounds, so drift on a shared machine hits all of them:

- `before`:  the code at `--baseline-ref` (default HEAD: before uncommitted telemetry work), exported to
             a temporary directory: the request path as it was, with no telemetry at all;
- `off`:     this tree with `telemetry: {metrics: false, access_log: {enabled: false}}` (tracing is off by
             default): what an operator who turns everything off pays;
- `metrics+logs`: the defaults: `GET /metrics` cells and one JSON access-log line per request (to a file);
- `all`:     plus tracing with every span built and handed to a BatchSpanProcessor whose exporter drops
             them (`tracing.exporter: none`), so no collector and no network are involved.

One simulated backend with zero token delays and wrk share the second CPU. Reports requests/s and
gateway CPU µs per request per mode (medians over rounds), and each mode's throughput ratio against
`before` (the median of each round's ratio, so drift between rounds cancels).

Usage: python -m loadtest.bench_telemetry [--duration 5] [--rounds 3] [--connections 64]
       [--baseline-ref HEAD | --baseline-ref none] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
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

ROOT = Path(__file__).resolve().parents[1]
MODES = ("before", "off", "metrics+logs", "all")


def _telemetry(mode: str, workdir: Path) -> dict[str, Any] | None:
    if mode == "before":
        return None  # the old config schema has no `telemetry` section
    if mode == "off":
        return {"metrics": False, "access_log": {"enabled": False}}
    on: dict[str, Any] = {"metrics": True, "access_log": {"destination": str(workdir / f"access-{mode}.log")}}
    if mode == "all":
        on["tracing"] = {"enabled": True, "exporter": "none"}
    return on


def _config(port: int, backend_url: str, mode: str, workdir: Path) -> dict[str, Any]:
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
    telemetry = _telemetry(mode, workdir)
    if telemetry is not None:
        config["telemetry"] = telemetry
    return config


def _export(ref: str, into: Path) -> Path:
    """The tree at `ref`, exported (not checked out: the work tree is left alone)."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def run(duration: float, rounds: int, connections: int, baseline_ref: str | None) -> dict[str, Any]:
    wrk = which("wrk")
    if wrk is None:
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    modes = MODES if baseline_ref else MODES[1:]
    reference = modes[0]
    proxy_cpu, load_cpu = pick_cpus()
    samples: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="bench-telemetry-") as tmp:
        work = Path(tmp)
        script = work / "post.lua"
        script.write_text(_WRK_SCRIPT)
        group = ProcessGroup(work)
        try:
            backend_url = start_zero_delay_backend(group, MODEL, load_cpu)
            gateways: dict[str, tuple[str, int]] = {}
            for mode in modes:
                port = free_port()
                path = work / f"gateway-{mode}.yaml"
                path.write_text(yaml.safe_dump(_config(port, backend_url, mode, work)))
                cwd = str(_export(baseline_ref, work / "before-tree")) if mode == "before" else str(ROOT)
                level = "info" if mode in ("metrics+logs", "all") else "warning"
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
                gateways[mode] = (url, child.pid)
            for url, _ in gateways.values():  # warm up
                _wrk(wrk, url + "/v1/chat/completions", script, connections, 1, load_cpu)
            for r in range(rounds):
                order = modes[r % len(modes) :] + modes[: r % len(modes)]
                for mode in order:
                    url, pid = gateways[mode]
                    cpu_before = session_cpu_seconds(pid)
                    rps = _wrk(wrk, url + "/v1/chat/completions", script, connections, duration, load_cpu)
                    cpu = session_cpu_seconds(pid) - cpu_before
                    samples[mode].append((rps, cpu / max(1.0, rps * duration) * 1e6))
            logged = sum(
                len(p.read_bytes().splitlines()) for p in work.glob("access-*.log")
            )  # the lines were really written
        finally:
            group.close()
    summary: dict[str, Any] = {
        mode: {
            "rps": statistics.median(s[0] for s in samples[mode]),
            "cpu_us_per_req": statistics.median(s[1] for s in samples[mode]),
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
    lines = [f"{'telemetry':<13} {'req/s':>8} {'vs ' + ref:>10} {'CPU µs/req':>11}  req/s per round"]
    for mode in modes:
        s = summary[mode]
        lines.append(
            f"{mode:<13} {s['rps']:>8.0f} {s['vs_' + ref]:>10.3f} {s['cpu_us_per_req']:>11.0f}  {s['rounds']}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per mode and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--baseline-ref", default="HEAD", help="git ref for `before`; `none` to skip it")
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
