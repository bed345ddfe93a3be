"""The images: the runtime install only, every package the project installs copied in, non-root, and a
health check and command the gateway and simulator really understand. (No container engine runs here;
tests/cluster/test_images.py runs the same install step in a fresh virtualenv.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.unit.deploy.deploy_checks import DEPLOY, ROOT, gateway_command, sim_command

DOCKERFILES = sorted((DEPLOY / "docker").glob("*.Dockerfile"))


def instructions(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    rows = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    return [(row.split(None, 1)[0].upper(), row.split(None, 1)[1] if " " in row else "") for row in rows]


def install_command(path: Path) -> str:
    runs = [arg for op, arg in instructions(path) if op == "RUN" and "pip install" in arg]
    assert len(runs) == 1, f"{path.name}: one pip install step expected"
    return runs[0]


def test_there_are_a_gateway_and_a_simulator_image() -> None:
    assert [p.name for p in DOCKERFILES] == ["gateway.Dockerfile", "sim.Dockerfile"]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_the_image_installs_the_runtime_only_from_everything_the_package_needs(path: Path) -> None:
    steps = instructions(path)
    assert sum(op == "FROM" for op, _ in steps) == 2, "multi-stage: a build stage and a runtime stage"
    command = install_command(path)
    # The gateway image is the runtime install alone; the simulator's adds the `[sim]` extra only.
    wanted = (
        r"pip install [^&]*\.$" if path.name == "gateway.Dockerfile" else r"pip install [^&]*\"\.\[sim\]\"$"
    )
    assert re.search(wanted, command), command
    copied = {arg.split()[0] for op, arg in steps if op == "COPY" and not arg.startswith("--from")}
    copied |= {word for op, arg in steps if op == "COPY" for word in arg.split()[:-1]}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages | {"pyproject.toml", project["project"]["readme"]} <= copied
    # The versions CI tested together (deploy/constraints.txt), not whatever is newest on the day of a build.
    assert "deploy/constraints.txt" in copied and " -c deploy/constraints.txt " in command, command
    runtime = steps[[i for i, (op, _) in enumerate(steps) if op == "FROM"][-1] :]
    user = [arg for op, arg in runtime if op == "USER"]
    assert user and user[-1].split(":")[0] not in ("root", "0")
    assert any(op == "HEALTHCHECK" and "/health" in arg for op, arg in runtime)


def test_both_images_install_the_same_way() -> None:
    gateway, sim = (install_command(p) for p in DOCKERFILES)
    assert sim == gateway[: -len(".")] + '".[sim]"'


def _json_list(arg: str) -> list[str]:
    import json

    return list(json.loads(arg))


def test_the_gateway_image_runs_a_command_the_cli_accepts() -> None:
    steps = dict(instructions(DEPLOY / "docker" / "gateway.Dockerfile"))
    assert _json_list(steps["ENTRYPOINT"]) == ["switchyard"]
    args = gateway_command(_json_list(steps["CMD"]))
    assert args.command == "serve" and args.host == "0.0.0.0"
    health = steps["HEALTHCHECK"]
    exposed = steps["EXPOSE"].split()
    assert re.search(r"127\.0\.0\.1:(\d+)/health", health).group(1) in exposed  # type: ignore[union-attr]


def test_the_simulator_image_runs_a_command_the_simulator_accepts() -> None:
    steps = dict(instructions(DEPLOY / "docker" / "sim.Dockerfile"))
    assert _json_list(steps["ENTRYPOINT"]) == ["python", "-m", "backends.sim"]
    args = sim_command(_json_list(steps["CMD"]))
    assert str(args.port) in steps["EXPOSE"].split()
