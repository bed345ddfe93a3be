"""The runtime install serves traffic and nothing more: what `switchyard` and the app import when they load,
read statically from the source, and what pyproject.toml's runtime dependencies provide."""

from __future__ import annotations

import ast
import importlib.metadata
import io
import shutil
import sys
import tomllib
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("gateway", "backends", "policies", "loadtest")
ENTRY_POINTS = ("gateway.cli.main", "gateway.app", "gateway.serve.server")
"""What `switchyard serve` and an ASGI server load."""
TOOLING = ("backends.sim", "loadtest", "gateway.cli.demo")
TOOLING_DISTRIBUTIONS = ("openai", "granian")


def _module_path(module: str, root: Path = ROOT) -> Path | None:
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, *, at_import_time: bool, root: Path = ROOT) -> set[str]:
    """Dotted names `module` imports: only what runs when it is imported, or every import it holds."""
    path = _module_path(module, root)
    assert path is not None, module
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def walk(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                continue  # annotations only: never imported at run time
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and at_import_time:
                continue  # runs only when called
            for field in ("body", "orelse", "finalbody", "handlers"):
                children = getattr(node, field, None)
                if isinstance(children, list):
                    walk([c for c in children if isinstance(c, ast.stmt | ast.excepthandler)])

    walk(_parse(path.read_text()).body)
    return found


def _parse(source: str) -> ast.Module:
    # CPython 3.11 keeps the AST builder's recursion depth in state that all threads share: a module
    # compiled from source in another thread at the same moment (an import in a thread a test left
    # running) makes ast.parse raise SystemError "AST constructor recursion depth mismatch". Once more.
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)


def _project_modules(names: set[str], root: Path = ROOT) -> set[str]:
    """The project modules (and their parent packages) among dotted names that may end in a class name."""
    modules = set()
    for name in names:
        parts = name.split(".")
        if parts[0] not in PROJECT:
            continue
        for end in range(1, len(parts) + 1):
            if _module_path(".".join(parts[:end]), root) is not None:
                modules.add(".".join(parts[:end]))
    return modules


def loaded_at_import(entry_points: tuple[str, ...], root: Path = ROOT) -> tuple[set[str], set[str]]:
    """Project modules and third-party top-level names loaded by importing `entry_points`."""
    seen: set[str] = set()
    external: set[str] = set()
    todo = list(entry_points)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        names = _imports(module, at_import_time=True, root=root)
        external.update(n.split(".")[0] for n in names if n and n.split(".")[0] not in PROJECT)
        todo.extend(_project_modules(names, root) - seen)
    return seen, external


def runtime_modules() -> set[str]:
    """Project modules the runtime can reach, by any import (a function's too), short of the tooling."""
    seen: set[str] = set()
    todo = list(ENTRY_POINTS)
    while todo:
        module = todo.pop()
        if module in seen or module.startswith(TOOLING):
            continue
        seen.add(module)
        todo.extend(_project_modules(_imports(module, at_import_time=False)) - seen)
    return seen


def _runtime_requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def _installed_closure(requirements: list[Requirement]) -> set[str]:
    """Distribution names (normalised) the requirements pull in, following installed metadata."""
    closure: set[str] = set()
    todo = [(r, frozenset(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = req.name.lower().replace("_", "-")
        if (name, extras) in closure:
            continue
        closure.add((name, extras))
        for text in importlib.metadata.requires(req.name) or ():
            sub = Requirement(text)
            envs = [{"extra": e} for e in extras] or [{"extra": ""}]
            if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
                todo.append((sub, frozenset(sub.extras)))
    return {name for name, _ in closure}


def test_the_runtime_loads_no_tooling():
    modules, external = loaded_at_import(ENTRY_POINTS)
    assert "gateway.request.pipeline" in modules and "policies.engine" in modules  # the walk reaches far
    assert not {m for m in modules if m.startswith(TOOLING)}
    assert not external & set(TOOLING_DISTRIBUTIONS)


def test_the_check_fails_on_an_eager_tooling_import(tmp_path):
    """Not vacuous: an eager import of the demo from a module the app loads is seen, with what it drags in."""
    for package in PROJECT:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    ops = tmp_path / "gateway" / "admin" / "ops.py"
    ops.write_text(ops.read_text() + "\nfrom gateway.cli import demo  # noqa\n")
    modules, external = loaded_at_import(ENTRY_POINTS, tmp_path)
    assert {"gateway.cli.demo", "backends.sim.fleet", "backends.sim.fleet_spec"} <= modules
    assert "openai" in external


def test_runtime_dependencies_are_what_serving_needs():
    names = {r.name for r in _runtime_requirements()}
    assert not names & set(TOOLING_DISTRIBUTIONS)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert {"sim", "bench", "dev"} <= set(extras)
    assert any(Requirement(r).name == "import-linter" for r in extras["dev"])


def test_every_third_party_import_of_the_runtime_comes_with_the_runtime_install():
    """Each distribution the runtime modules import (eagerly or in a function) is a runtime dependency."""
    modules = runtime_modules()
    assert "gateway.ledger.redis_store" in modules
    installed = _installed_closure(_runtime_requirements())
    provided_by = importlib.metadata.packages_distributions()
    missing = {}
    for module in modules:
        for name in _imports(module, at_import_time=False):
            top = name.split(".")[0]
            if not top or top in PROJECT or top in sys.stdlib_module_names:
                continue
            dists = {d.lower().replace("_", "-") for d in provided_by.get(top, ())}
            if not dists & installed:
                missing[f"{module}: {top}"] = sorted(dists)
    assert missing == {}


def test_a_missing_extra_names_it(monkeypatch):
    from gateway.cli import main as cli

    monkeypatch.setitem(sys.modules, "openai", None)  # as if `switchyard[sim]` were not installed
    monkeypatch.delitem(sys.modules, "gateway.cli.demo", raising=False)
    err = io.StringIO()
    with redirect_stderr(err):
        assert cli.main(["demo", "--exit-after-traffic"]) == 2
    assert "needs the [sim] extra (cannot import openai): pip install 'switchyard[sim]'" in err.getvalue()


def test_loadtest_help_comes_from_the_tool(capsys):
    from gateway.cli import main as cli

    with pytest.raises(SystemExit) as exit_:
        cli.main(["loadtest", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: switchyard loadtest") and "--policies" in out
