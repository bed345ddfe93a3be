"""The fleet launcher: real subprocesses on loopback, and fleet-file validation."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from backends.lifetime import die_with_parent
from backends.sim.fleet import DEMO_FLEET, Fleet, FleetError, load_fleet_spec
from backends.sim.fleet_spec import parse_fleet_spec
from backends.yamlfile import ConfigError
from gateway.config.settings import load_settings

_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get_json(url: str) -> dict[str, object]:
    with _OPENER.open(url, timeout=2) as response:
        return dict(json.load(response))


def refuses(url: str) -> bool:
    try:
        _OPENER.open(f"{url}/health", timeout=1).close()
    except OSError:
        return True
    return False


def test_demo_fleet_runs_and_writes_gateway_config(tmp_path: Path) -> None:
    spec = load_fleet_spec(DEMO_FLEET)
    with Fleet(spec) as fleet:
        assert [(b.name, b.pool, b.vendor) for b in fleet.backends] == [
            ("h100-0", "h100", "nvidia"),
            ("h100-1", "h100", "nvidia"),
            ("mi300x-0", "mi300x", "amd"),
            ("mi300x-1", "mi300x", "amd"),
        ]
        assert len({b.port for b in fleet.backends}) == 4
        for backend in fleet.backends:
            card = get_json(f"{backend.url}/v1/models")["data"][0]  # type: ignore[index]
            assert card["id"] == "llama-3.1-8b" and card["max_model_len"] == backend.max_model_len
        path = fleet.write_gateway_config(tmp_path / "gateway.yaml", port=0)
        settings = load_settings(path)
        assert settings.server.port == 0
        assert [(b.name, b.url, b.vendor, b.max_model_len) for b in settings.backends] == [
            (b.name, b.url, b.vendor, b.max_model_len) for b in fleet.backends
        ]
        assert {p.name: p.price_per_gpu_hour for p in settings.pools} == {"h100": 2.90, "mi300x": 1.75}
        assert settings.pools[1].labels == {"tier": "capacity"}
        urls = [b.url for b in fleet.backends]
    assert all(refuses(url) for url in urls)


def test_fleet_names_the_backend_that_fails_to_start() -> None:
    spec = parse_fleet_spec(
        "model: m\ngroups:\n  - {pool: p, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1}\n"
    )
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        fleet = Fleet(spec, base_port=busy.getsockname()[1], startup_timeout=10)
        with pytest.raises(FleetError, match=r"backend p-0 \(http://127\.0\.0\.1:\d+\) exited"):
            fleet.start()


def test_fleet_file_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "model: m\n"
        "groups:\n"
        "  - pool: a\n"
        "    vendor: nvidia\n"
        "    accelerator: h100\n"
        "    price_per_gpu_hour: 2.9\n"
        "    tpot: 6\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as unknown:
        load_fleet_spec(path)
    assert unknown.value.line == 7 and str(unknown.value).startswith(f"{path}:7:")
    assert "tpot" in str(unknown.value)

    with pytest.raises(ConfigError) as bad_vendor:
        parse_fleet_spec("model: m\ngroups:\n  - pool: a\n    vendor: intel\n", "f.yaml")
    assert bad_vendor.value.line == 4

    twice = "model: m\ngroups:\n  - {pool: a, vendor: amd, accelerator: x, price_per_gpu_hour: 1}\n"
    twice += "  - {pool: a, vendor: amd, accelerator: x, price_per_gpu_hour: 1}\n"
    with pytest.raises(ConfigError, match="pool `a` is declared by two groups") as duplicate:
        parse_fleet_spec(twice, "f.yaml")
    assert duplicate.value.line == 4


def test_cli_runs_until_sigterm(tmp_path: Path) -> None:
    out = tmp_path / "gateway.yaml"
    process = subprocess.Popen(
        [sys.executable, "-m", "backends.sim.fleet", "--config", str(DEMO_FLEET), "--write-config", str(out)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=die_with_parent(),
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(6)]
        assert lines[0].split() == ["NAME", "POOL", "VENDOR", "URL"]
        assert lines[5].startswith("gateway config written to")
        urls = [line.split()[3] for line in lines[1:5]]
        assert all(get_json(f"{url}/version") == {"version": "sim-0.1"} for url in urls)
        assert len(load_settings(out).backends) == 4
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert all(refuses(url) for url in urls)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_profiles_faults_and_time_scale_reach_the_backends() -> None:
    spec = parse_fleet_spec(
        "model: llama-3.1-8b\n"
        "time_scale: 5\n"
        "groups:\n"
        "  - pool: big\n"
        "    vendor: amd\n"
        "    accelerator: mi300x\n"
        "    price_per_gpu_hour: 1.75\n"
        "    profile: {gpu: mi300x, overrides: {max_num_seqs: 64}}\n"
        "    faults: {error_rate: 0.5, error_status: 429}\n"
        "  - {pool: fixed, vendor: nvidia, accelerator: h100, price_per_gpu_hour: 2.9, time_scale: 2}\n"
    )
    with Fleet(spec) as fleet:
        big, fixed = fleet.backends
        info = get_json(f"{big.url}/sim/info")
        assert (info["timing"], info["gpu"], info["max_num_seqs"], info["time_scale"]) == (
            "model",
            "mi300x",
            64,
            5,
        )
        assert get_json(f"{big.url}/sim/faults")["error_status"] == 429
        assert get_json(f"{fixed.url}/sim/info") == {"name": "fixed-0", "time_scale": 2.0, "timing": "fixed"}


def test_profile_that_cannot_run_names_the_line() -> None:
    seventy = "model: llama-3.1-70b\ngroups:\n  - pool: a\n    vendor: nvidia\n    accelerator: h100\n"
    seventy += "    price_per_gpu_hour: 2.9\n    profile: {gpu: h100-sxm5}\n"
    with pytest.raises(ConfigError, match=r"f\.yaml:7: llama-3\.1-70b on 1x h100-sxm5 does not fit"):
        parse_fleet_spec(seventy, "f.yaml")
    assert parse_fleet_spec(seventy.replace("    profile", "    gpus_per_backend: 2\n    profile"), "f.yaml")
    with pytest.raises(ConfigError, match="unknown profile override `nope`"):
        parse_fleet_spec(seventy.replace("{gpu: h100-sxm5}", "{gpu: mi300x, overrides: {nope: 1}}"), "f.yaml")
