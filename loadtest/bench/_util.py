"""Helpers the micro-benchmarks share: CPU pinning and accounting, tools on PATH, a zero-delay backend.

Starting and stopping children is loadtest/processes.py (the load test uses it too).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from loadtest.processes import Child, ProcessGroup, free_port, wait_until

CLK_TCK = os.sysconf("SC_CLK_TCK")


def usable_cpus() -> list[int]:
    """CPUs this process may run on, sorted."""
    return sorted(os.sched_getaffinity(0))


def pick_cpus() -> tuple[int, int]:
    """(proxy CPU, load CPU): the first two usable CPUs, or the same one on a single-CPU machine."""
    cpus = usable_cpus()
    return cpus[0], cpus[1] if len(cpus) > 1 else cpus[0]


def which(name: str, *extra_dirs: str) -> str | None:
    """Path of an executable on PATH or in ``extra_dirs`` (e.g. /usr/sbin, not on every PATH)."""
    found = shutil.which(name)
    if found:
        return found
    for directory in extra_dirs:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def _stat_fields(pid: int) -> list[str]:
    """``/proc/<pid>/stat`` fields after the command name (fields[0] is stat field 3, the state)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    return raw[raw.rfind(")") + 2 :].split()


def process_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds used so far by process ``pid`` (all threads), outside any session."""
    return sum(process_cpu_split(pid))


def process_cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds used so far by process ``pid`` (all threads)."""
    fields = _stat_fields(pid)
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK  # utime, stime = stat fields 14, 15


def _session_stats(sid: int) -> list[list[str]]:
    """``/proc/<pid>/stat`` fields (after the command name) of every live process in session ``sid``."""
    rows: list[list[str]] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
        except OSError:
            continue
        # fields[0] is state (stat field 3); session is stat field 6 -> fields[3].
        if int(fields[3]) == sid:
            rows.append(fields)
    return rows


def session_cpu_seconds(sid: int) -> float:
    """User+system CPU seconds used so far by all live processes of session ``sid`` (all threads)."""
    return sum(session_cpu_split(sid))


def session_cpu_split(sid: int) -> tuple[float, float]:
    """User and system CPU seconds used so far by all live processes of session ``sid`` (all threads)."""
    rows = _session_stats(sid)
    user = sum(int(f[11]) for f in rows)  # utime, stime = stat fields 14, 15
    return user / CLK_TCK, sum(int(f[12]) for f in rows) / CLK_TCK


def http_post(url: str, body: bytes, timeout: float = 5.0) -> tuple[int, bytes]:
    """One blocking POST (for readiness checks and validation); returns (status, body)."""
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


def assert_loopback(url: str) -> None:
    """Refuse anything but http://127.0.0.1 targets."""
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"only http://127.0.0.1 targets are allowed, got {url!r}")


def python_argv(module: str, *args: str) -> list[str]:
    """``python -m module args...`` with the current interpreter."""
    return [sys.executable, "-m", module, *args]


def floor_argv(port: int, upstream_url: str) -> list[str]:
    """A bare Python relay (loadtest/bench/floor_proxy.py) on loopback `port` in front of `upstream_url`."""
    return python_argv("loadtest.bench.floor_proxy", "--port", str(port), "--upstream", upstream_url)


def healthy(url: str) -> bool:
    """Whether `url` answers `GET /health` with 200 (no proxy; raises OSError while it is not up yet)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"{url}/health", timeout=1) as response:
        return bool(response.status == 200)


def start_zero_delay_backend(group: ProcessGroup, model: str, cpu: int | None) -> str:
    """A simulated backend that answers at once (its own time is only HTTP work); returns its URL once up."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    assert_loopback(url)
    child = group.start(
        "backend",
        python_argv(
            "backends.sim", "--port", str(port), "--model", model, "--ttft-ms", "0", "--tpot-ms", "0"
        ),
        cpu=cpu,
    )
    wait_until(lambda: healthy(url), timeout=30, what="backend", child=child)
    return url


def bench_pools(backend_url: str, model: str) -> list[dict[str, Any]]:
    """The gateway config's `pools`: one H100 pool with the one benchmark backend."""
    return [
        {
            "name": "bench",
            "vendor": "nvidia",
            "accelerator": "h100",
            "price_per_gpu_hour": 2.9,
            "backends": [{"url": backend_url, "models": [model], "max_model_len": 8192}],
        }
    ]


def serve_argv(config: Path) -> list[str]:
    """``switchyard serve`` of `config`, logging warnings only."""
    return python_argv("gateway.cli", "serve", "--config", str(config), "--log-level", "warning")


def start_gateway(
    group: ProcessGroup,
    name: str,
    argv: list[str],
    port: int,
    cpu: int,
    *,
    cwd: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
    ready: Callable[[str], bool] = healthy,
) -> tuple[str, Child]:
    """Start a gateway listening on `port` pinned to `cpu`; its URL and child once `ready(url)` holds (by
    default: it answers /health)."""
    child = group.start(name, argv, cpu=cpu, cwd=cwd, env=env)
    url = f"http://127.0.0.1:{port}"
    assert_loopback(url)
    wait_until(lambda: ready(url), timeout=timeout, what=url, child=child)
    return url, child


def start_per_shape(
    group: ProcessGroup,
    name: str,
    argv_of: Callable[[int, str], list[str]],
    upstreams: dict[str, str],
    shapes: list[str],
    answers: Callable[[str, str], bool],
    cpu: int,
) -> dict[str, tuple[str, Child]]:
    """One relay per upstream shape, `argv_of(port, upstream_url)` on a free port pinned to `cpu`;
    {shape: (URL, child)} once `answers(url, shape)` holds for each."""
    started = {}
    for shape in shapes:
        port = free_port()
        started[shape] = start_gateway(
            group,
            f"{name}-{shape}",
            argv_of(port, upstreams[shape]),
            port,
            cpu,
            timeout=60,
            ready=_answering(answers, shape),
        )
    return started


def _answering(answers: Callable[[str, str], bool], shape: str) -> Callable[[str], bool]:
    return lambda url: answers(url, shape)


def start_static_backend(group: ProcessGroup, model: str, cpu: int, work: Path) -> str:
    """nginx answering a static chat completion (the gateway is then the bottleneck), or without nginx a
    simulated backend with zero token delays; its base URL."""
    from loadtest.bench.http_clients.upstream import start_upstream  # it imports this module

    if which("nginx", "/usr/sbin", "/usr/local/sbin"):
        return start_upstream(group, "nginx", cpu, work).json_base
    return start_zero_delay_backend(group, model, cpu)


def run_wrk(
    wrk: str,
    url: str,
    script: Path,
    connections: int,
    duration: float,
    cpu: int,
    *,
    refuse_socket_errors: bool = False,
) -> tuple[float, float]:
    """(requests/s, p50 ms) of one `wrk -t1` run of `script` against `url`, pinned to `cpu`; raises when
    wrk failed or any answer was not 2xx/3xx (or, with `refuse_socket_errors`, a connection failed)."""
    out = subprocess.run(
        wrk_argv(wrk, url, script, connections, duration),
        capture_output=True,
        text=True,
        timeout=duration + 30,
        preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
        check=True,
    ).stdout
    return wrk_figures(out, url, refuse_socket_errors=refuse_socket_errors)


def wrk_argv(wrk: str, url: str, script: Path, connections: int, duration: float) -> list[str]:
    """One wrk thread running `script` against `url`, reporting its latency distribution."""
    return [wrk, "-t1", f"-c{connections}", f"-d{duration:g}s", "--latency", "-s", str(script), url]


def wrk_figures(out: str, url: str, *, refuse_socket_errors: bool = False) -> tuple[float, float]:
    """(requests/s, p50 ms) from the report of a `wrk_argv` run; raises when wrk failed or any answer was
    not 2xx/3xx (or, with `refuse_socket_errors`, a connection failed)."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)\b", out)
    refused = "Non-2xx or 3xx responses" in out or (refuse_socket_errors and "Socket errors" in out)
    if rps is None or p50 is None or refused:
        raise RuntimeError(f"wrk failed or saw errors against {url}:\n{out}")
    return float(rps.group(1)), float(p50.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[p50.group(2)]


def delete_prefix(redis_url: str, prefix: str) -> int:
    """Delete every Redis key whose name holds `prefix` (what a benchmark left); how many there were."""
    client = redis.Redis.from_url(redis_url)
    try:
        names = list(client.scan_iter(match=f"*{prefix}*", count=1000))
        if names:
            client.delete(*names)
        return len(names)
    finally:
        client.close()
