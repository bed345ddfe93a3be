"""The layers hold: import-linter's contracts (pyproject.toml) pass, no module imports itself round a cycle,
and both checks fail on a violation planted in a copy of the project."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "backends", "policies", "loadtest")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _ignored_imports() -> set[tuple[str, str]]:
    """The exemptions the acyclic contract lists, so both checks allow exactly the same imports."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    ignored: set[tuple[str, str]] = set()
    for contract in config["contracts"]:
        for line in contract.get("ignore_imports", ()):
            importer, _, imported = line.partition(" -> ")
            ignored.add((importer.strip(), imported.strip()))
    return ignored


_EDGES = """
import json, sys
import grimp
graph = grimp.build_graph(*sys.argv[1:], cache_dir=None)
print(json.dumps([[m, i] for m in graph.modules for i in graph.find_modules_directly_imported_by(m)]))
"""


def _import_edges(root: Path, packages: tuple[str, ...]) -> dict[str, set[str]]:
    """Every import among the packages under `root`, read by grimp in a fresh interpreter (so the project
    already imported here is not what is read)."""
    result = subprocess.run(
        [sys.executable, "-c", _EDGES, *packages], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    edges: dict[str, set[str]] = {}
    for importer, imported in json.loads(result.stdout):
        edges.setdefault(importer, set()).add(imported)
    return edges


def import_cycles(root: Path, packages: tuple[str, ...], ignored: set[tuple[str, str]]) -> list[list[str]]:
    """Groups of modules that import each other round a cycle (annotation-only imports count too)."""
    edges = _import_edges(root, packages)
    for importer, imported in ignored:
        edges.get(importer, set()).discard(imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's strongly connected components
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def _copy_project(dest: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_import_contracts_hold():
    result = _lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_module_is_part_of_an_import_cycle():
    assert import_cycles(ROOT, PACKAGES, _ignored_imports()) == []


def test_a_policy_importing_the_gateway_breaks_the_contract(tmp_path):
    copy = _copy_project(tmp_path)
    framework = copy / "policies" / "framework.py"
    framework.write_text(framework.read_text() + "\nfrom gateway.openai.errors import GatewayError  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "policies are a library: no gateway, no simulator BROKEN" in result.stdout
    assert "policies.framework -> gateway.openai.errors" in result.stdout


def test_a_backend_importing_the_gateway_breaks_the_contract(tmp_path):
    copy = _copy_project(tmp_path)
    health = copy / "backends" / "health.py"
    health.write_text(health.read_text() + "\nimport gateway.config.settings  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "backends are a library: no gateway, no policies BROKEN" in result.stdout
    assert "backends.health -> gateway.config.settings" in result.stdout


def test_the_runtime_importing_the_simulator_breaks_the_contract(tmp_path):
    copy = _copy_project(tmp_path)
    relay = copy / "gateway" / "request" / "relay.py"
    relay.write_text(relay.read_text() + "\nimport backends.sim.engine  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "the runtime never imports the simulator" in result.stdout and "BROKEN" in result.stdout
    assert "gateway.request.relay -> backends.sim.engine" in result.stdout


def test_a_cycle_planted_under_type_checking_is_found(tmp_path):
    copy = _copy_project(tmp_path)
    breaker = copy / "backends" / "breaker.py"
    text = breaker.read_text().replace(
        "import msgspec\n",
        "import msgspec\n\nif TYPE_CHECKING:\n    from backends.models import Backend  # noqa\n",
        1,
    )
    breaker.write_text(text.replace("from typing import ", "from typing import TYPE_CHECKING, ", 1))
    assert import_cycles(copy, PACKAGES, _ignored_imports()) == [["backends.breaker", "backends.models"]]
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "no cycles between sibling packages BROKEN" in result.stdout


@pytest.mark.parametrize(
    ("module", "imported"),
    [
        ("redis/resp.py", "gateway.request.pipeline"),  # the Redis client reaching up into the request path
        ("request/relay.py", "gateway.http.routes"),  # the request path reaching up into an HTTP route
        ("config/ledger.py", "gateway.ledger.records"),  # config reading the ledger it configures
    ],
)
def test_an_upward_import_between_gateway_rooms_breaks_the_layers(tmp_path, module, imported):
    copy = _copy_project(tmp_path)
    path = copy / "gateway" / module
    path.write_text(path.read_text() + f"\nimport {imported}  # noqa\n")
    result = _lint_imports(copy)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "gateway's rooms point one way" in result.stdout and "BROKEN" in result.stdout
    importer = "gateway." + module.removesuffix(".py").replace("/", ".")
    assert f"{importer} -> {imported}" in result.stdout
