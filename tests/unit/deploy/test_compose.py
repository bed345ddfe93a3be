"""The Compose file: every service's command, ports and environment match what the gateway, the simulator
and the balancer really accept, and each profile holds what it must."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.deploy.deploy_checks import (
    DEPLOY,
    ArgumentError,
    compose_defaults,
    gateway_command,
    gateway_env_names,
    load_gateway_config,
    sim_command,
)

COMPOSE = DEPLOY / "compose" / "compose.yaml"


def _services() -> dict[str, dict[str, Any]]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def _command(service: dict[str, Any]) -> list[str]:
    return [compose_defaults(str(part)) for part in service["command"]]


def _in(profile: str) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in _services().items() if profile in s.get("profiles", [])}


def _gateways() -> dict[str, dict[str, Any]]:
    return {n: s for n, s in _services().items() if "gateway.Dockerfile" in str(s.get("build", ""))}


def test_every_gateway_service_runs_a_command_the_cli_accepts_with_a_valid_config(tmp_path: Path) -> None:
    gateways = _gateways()
    assert len(gateways) == 3
    for name, service in gateways.items():
        args = gateway_command(_command(service))
        assert args.command == "serve" and args.host == "0.0.0.0", name
        mount = next(v for v in service["volumes"] if v.endswith(":/etc/switchyard:ro"))
        folder = COMPOSE.parent / mount.split(":")[0]
        settings = load_gateway_config((folder / Path(args.config).name).read_text(), tmp_path / name)
        assert {str(settings.server.port), str(getattr(settings.server, "admin_port", 8081))} <= set(
            service["expose"]
        ), name
        assert set(service["environment"]) <= gateway_env_names(), name
        grace = int(service["stop_grace_period"].rstrip("s"))
        assert grace >= settings.server.shutdown_grace, name
        assert "ports" not in service, f"{name}: only the balancer publishes a port"


def test_every_profile_config_loads_and_points_at_services_of_its_profile(tmp_path: Path) -> None:
    services = _services()
    for profile in ("sim", "cuda", "rocm"):
        text = (COMPOSE.parent / f"gateway-{profile}.yaml").read_text()
        settings = load_gateway_config(text, tmp_path / profile)
        assert settings.ledger.redis_url == "redis://redis:6379/0"
        for backend in settings.backends:
            host, port = re.match(r"http://([^:/]+):(\d+)", backend.url).groups()  # type: ignore[union-attr]
            assert profile in services[host]["profiles"], (profile, host)
            assert port in services[host]["expose"]
        assert "auth:\n  mode: keys" in text


def test_the_simulated_backends_run_commands_the_simulator_accepts() -> None:
    sims = {n: s for n, s in _in("sim").items() if n.startswith("sim-")}
    assert len(sims) == 4
    for name, service in sims.items():
        args = sim_command(_command(service))
        assert args.host == "0.0.0.0" and str(args.port) in service["expose"], name
        assert args.name == name.removeprefix("sim-")


def test_gpu_profiles_get_their_devices_and_share_the_model_cache() -> None:
    cuda, rocm = _services()["vllm-cuda"], _services()["vllm-rocm"]
    assert cuda["profiles"] == ["cuda"] and rocm["profiles"] == ["rocm"]
    devices = cuda["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}]
    assert set(rocm["devices"]) == {"/dev/kfd", "/dev/dri"}
    assert set(rocm["group_add"]) == {"video", "render"}
    assert "seccomp=unconfined" in rocm["security_opt"] and rocm["ipc"] == "host" and rocm["shm_size"]
    assert compose_defaults(cuda["image"]).startswith("vllm/vllm-openai")
    assert compose_defaults(rocm["image"]).startswith("rocm/vllm")
    cache = "model-cache:/models"
    assert cache in cuda["volumes"] and cache in rocm["volumes"]
    assert "model-cache" in yaml.safe_load(COMPOSE.read_text())["volumes"]


def test_only_the_balancer_publishes_a_port_and_it_reaches_every_replica() -> None:
    published = {n for n, s in _services().items() if "ports" in s}
    assert published == {"balancer"}
    config = (COMPOSE.parent / "haproxy.cfg").read_text()
    servers = re.findall(r"^\s*server (\S+) (\S+):(\d+) check", config, re.M)
    assert {(name, host) for name, host, _ in servers} == {(n, n) for n in _gateways()}
    assert {port for *_, port in servers} == {"8080"}
    assert "option httpchk GET /ready" in config and "path_beg /admin/" in config


def test_the_gateways_trust_only_the_balancers_proxy_header(tmp_path: Path) -> None:
    import ipaddress

    compose = yaml.safe_load(COMPOSE.read_text())
    subnet = ipaddress.ip_network(compose["networks"]["default"]["ipam"]["config"][0]["subnet"])
    balancer = ipaddress.ip_address(_services()["balancer"]["networks"]["default"]["ipv4_address"])
    assert balancer in subnet
    config = (COMPOSE.parent / "haproxy.cfg").read_text()
    assert re.search(r"^\s*default-server .*\bsend-proxy-v2\b", config, re.M)
    for profile in ("sim", "cuda", "rocm"):
        text = (COMPOSE.parent / f"gateway-{profile}.yaml").read_text()
        server = load_gateway_config(text, tmp_path / profile).server
        assert server.trusted_proxies == [f"{balancer}/32"], profile
        assert server.proxy_protocol == "required", profile


@pytest.mark.skipif(
    shutil.which("haproxy") is None,
    reason="haproxy is not installed (make test and make test-cluster install it)",
)
def test_haproxy_accepts_the_balancer_config() -> None:
    result = subprocess.run(
        ["haproxy", "-c", "-f", str(COMPOSE.parent / "haproxy.cfg")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_renamed_flag_fails() -> None:
    service = dict(_gateways()["gateway-1"])
    command = [("--listen-host" if part == "--host" else part) for part in _command(service)]
    with pytest.raises(ArgumentError, match="unrecognized arguments: --listen-host"):
        gateway_command(command)
