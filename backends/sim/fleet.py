"""Run a fleet of simulated vLLM backends as local subprocesses and describe it as a gateway config.

The fleet file format is documented in `backends.sim.fleet_spec`; `DEMO_FLEET` is the shipped
two-H100, two-MI300X example. Every backend is a `python -m backends.sim` process in its own
process group, listening on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from backends.lifetime import die_with_parent
from backends.ports import port_of, reserve_port
from backends.sim.faults import Faults
from backends.sim.fleet_spec import DEMO_FLEET, FleetSpec, GroupSpec, ProfileSpec, load_fleet_spec
from backends.yamlfile import ConfigError

__all__ = ["DEMO_FLEET", "Fleet", "FleetError", "SimBackend", "load_fleet_spec", "main"]

_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class FleetError(RuntimeError):
    """A backend of the fleet could not be started."""


@dataclass(frozen=True, slots=True)
class SimBackend:
    name: str
    pool: str
    vendor: str
    accelerator: str
    host: str
    port: int
    model: str
    max_model_len: int
    ttft_ms: float
    tpot_ms: float
    fail_status: int | None
    profile: ProfileSpec | None = None
    gpus: int = 1
    faults: Faults | None = None
    time_scale: float = 1.0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        args = [sys.executable, "-m", "backends.sim", "--host", self.host, "--port", str(self.port)]
        args += ["--name", self.name, "--model", self.model, "--max-model-len", str(self.max_model_len)]
        args += ["--ttft-ms", str(self.ttft_ms), "--tpot-ms", str(self.tpot_ms)]
        if self.fail_status is not None:
            args += ["--fail-status", str(self.fail_status)]
        if self.profile is not None and self.profile.calibrated is not None:
            args += ["--calibrated", self.profile.calibrated]
        elif self.profile is not None and self.profile.gpu is not None:
            args += ["--gpu", self.profile.gpu, "--gpus", str(self.gpus)]
            args += ["--model-profile", self.profile.model or self.model]
            for key, value in self.profile.overrides.items():
                args += ["--profile-override", f"{key}={value}"]
        if self.time_scale != 1.0:
            args += ["--time-scale", str(self.time_scale)]
        faults = self.faults
        if faults is not None:
            args += ["--error-rate", str(faults.error_rate), "--error-status", str(faults.error_status)]
            args += ["--added-latency-ms", str(faults.added_latency_ms)]
            if faults.hang:
                args.append("--hang")
            if faults.die_after_tokens is not None:
                args += ["--die-after-tokens", str(faults.die_after_tokens)]
            if faults.refuse_connections_s is not None:
                args += ["--refuse-connections-s", str(faults.refuse_connections_s)]
        return args


class Fleet:
    """Simulated backends described by a fleet spec; `start()` launches them, `stop()` ends them.

    With `base_port` the backends listen on consecutive ports from it, in file order; with 0 or
    None each gets a free port picked at start and held until `stop()` (backends/ports.py), so that no
    other process gets it while the backend starts or after it died.
    """

    def __init__(
        self,
        spec: FleetSpec,
        base_port: int | None = None,
        host: str = "127.0.0.1",
        log_dir: str | Path | None = None,
        startup_timeout: float = 20.0,
    ) -> None:
        self.spec = spec
        self.host = host
        self.base_port = base_port or None
        self.startup_timeout = startup_timeout
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._temp_logs: tempfile.TemporaryDirectory[str] | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._held: list[socket.socket] = []
        self.backends: list[SimBackend] = self._plan(lambda index: (self.base_port or 0) + index)

    def _plan(self, port_for: Callable[[int], int]) -> list[SimBackend]:
        backends: list[SimBackend] = []
        for group in self.spec.groups:
            for index in range(group.count):
                backends.append(self._backend(group, index, port_for(len(backends))))
        return backends

    def _backend(self, group: GroupSpec, index: int, port: int) -> SimBackend:
        return SimBackend(
            name=f"{group.pool}-{index}",
            pool=group.pool,
            vendor=group.vendor,
            accelerator=group.accelerator,
            host=self.host,
            port=port,
            model=group.model or self.spec.model,
            max_model_len=group.max_model_len or self.spec.max_model_len,
            ttft_ms=group.ttft_ms,
            tpot_ms=group.tpot_ms,
            fail_status=group.fail_status,
            profile=group.profile,
            gpus=group.gpus_per_backend,
            faults=group.faults,
            time_scale=group.time_scale or self.spec.time_scale,
        )

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._temp_logs = tempfile.TemporaryDirectory(prefix="switchyard-fleet-")
            self._log_dir = Path(self._temp_logs.name)
        return self._log_dir

    def log_path(self, backend: SimBackend) -> Path:
        return self.log_dir / f"{backend.name}.log"

    def start(self) -> Fleet:
        """Launch every backend and wait until each answers GET /health."""
        if self._processes:
            raise FleetError("the fleet is already running")
        if self.base_port is None:
            self.backends = self._plan(self._hold_port)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_PROJECT_ROOT), env.get("PYTHONPATH")]))
        preexec = die_with_parent()
        try:
            for backend in self.backends:
                with self.log_path(backend).open("wb") as log:
                    self._processes[backend.name] = subprocess.Popen(
                        backend.command(),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                        preexec_fn=preexec,
                    )
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def _hold_port(self, _index: int) -> int:
        self._held.append(reserve_port(self.host))
        return port_of(self._held[-1])

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        pending = list(self.backends)
        while pending:
            for backend in list(pending):
                process = self._processes[backend.name]
                if process.poll() is not None:
                    raise FleetError(
                        f"backend {backend.name} ({backend.url}) exited with status {process.returncode} "
                        f"before it was ready: {self._log_tail(backend)}"
                    )
                if _healthy(backend.url):
                    pending.remove(backend)
            if pending and time.monotonic() > deadline:
                names = ", ".join(f"{b.name} ({b.url})" for b in pending)
                raise FleetError(f"not ready after {self.startup_timeout:.0f} s: {names}")
            if pending:
                time.sleep(0.05)

    def _log_tail(self, backend: SimBackend, lines: int = 5) -> str:
        try:
            text = self.log_path(backend).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty log)"

    def stop(self, grace: float = 3.0) -> None:
        """SIGTERM every backend's process group, then SIGKILL what is left after `grace` seconds."""
        processes = list(self._processes.values())
        self._processes.clear()
        for process in processes:
            _signal_group(process, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(process, signal.SIGKILL)
                process.wait()
        for sock in self._held:
            sock.close()
        self._held.clear()
        if self._temp_logs is not None:
            self._temp_logs.cleanup()
            self._temp_logs = None
            self._log_dir = None

    def exited(self) -> list[str]:
        """Names of backends whose process has ended while the fleet runs."""
        return [name for name, process in self._processes.items() if process.poll() is not None]

    def __enter__(self) -> Fleet:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def gateway_config(self, **server_options: Any) -> dict[str, Any]:
        """The gateway config (as `gateway.config.settings` reads it) routing to this fleet's backends."""
        pools: list[dict[str, Any]] = []
        for group in self.spec.groups:
            members = [b for b in self.backends if b.pool == group.pool]
            pools.append(
                {
                    "name": group.pool,
                    "vendor": group.vendor,
                    "accelerator": group.accelerator,
                    "gpus_per_backend": group.gpus_per_backend,
                    "price_per_gpu_hour": group.price_per_gpu_hour,
                    "labels": dict(group.labels),
                    "backends": [
                        {"name": b.name, "url": b.url, "models": [b.model], "max_model_len": b.max_model_len}
                        for b in members
                    ],
                }
            )
        config: dict[str, Any] = {}
        if server_options:
            config["gateway"] = dict(server_options)
        config["pools"] = pools
        return config

    def write_gateway_config(self, path: str | Path, **server_options: Any) -> Path:
        target = Path(path)
        header = "# Generated by `switchyard sim fleet`: simulated vLLM backends on this machine.\n"
        text = yaml.safe_dump(self.gateway_config(**server_options), sort_keys=False)
        target.write_text(header + text, encoding="utf-8")
        return target


def _healthy(url: str) -> bool:
    try:
        with _NO_PROXY.open(f"{url}/health", timeout=1.0) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)


def _print_table(fleet: Fleet) -> None:
    rows = [("NAME", "POOL", "VENDOR", "URL")]
    rows += [(b.name, b.pool, b.vendor, b.url) for b in fleet.backends]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


def main(argv: list[str] | None = None) -> int:
    """`switchyard sim fleet`: run a simulated fleet until SIGINT, SIGTERM or SIGHUP."""
    parser = argparse.ArgumentParser(prog="switchyard sim fleet", description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=DEMO_FLEET, help="fleet file (default: the demo)")
    parser.add_argument("--base-port", type=int, default=None, help="first port; default: free ports")
    parser.add_argument("--write-config", type=Path, default=None, help="write a gateway config here")
    parser.add_argument("--log-dir", type=Path, default=None, help="keep backend logs here")
    args = parser.parse_args(argv)
    try:
        spec = load_fleet_spec(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set())
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    fleet = Fleet(spec, base_port=args.base_port, log_dir=args.log_dir)
    try:
        try:
            fleet.start()
        except FleetError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        _print_table(fleet)
        if args.write_config is not None:
            fleet.write_gateway_config(args.write_config)
            print(f"gateway config written to {args.write_config}")
        sys.stdout.flush()
        reported: set[str] = set()
        while not stop.wait(1.0):
            for name in set(fleet.exited()) - reported:
                print(f"warning: backend {name} exited", file=sys.stderr)
                reported.add(name)
    finally:
        fleet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
