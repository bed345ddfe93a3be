"""The plugin reference (policies/reference.py): generated from the registry, committed as docs/plugins.md,
printed by `switchyard policy plugins`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgspec
import pytest

from backends.models import BackendConfig, PoolConfig, build_backends
from gateway.cli import main as cli
from policies import registry
from policies.config import parse_policy
from policies.engine import PolicyEngine
from policies.reference import ALWAYS_RUN, REGENERATE, markdown, plugin_docs, text

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "plugins.md"


class _TiltParams(msgspec.Struct, forbid_unknown_fields=True):
    pool: str
    """The pool whose backends score 1."""
    weight: float = 0.5
    """What every other backend scores."""


class _Tilt:
    """Backends of one pool score 1, the others `weight`."""

    name = "tilt"

    def __init__(self, params: _TiltParams) -> None:
        self.params = params


@pytest.fixture
def built_ins(monkeypatch):
    """The registry as a fresh process has it: other tests may have imported plugin modules (round-robin)."""
    own = {name: p for name, p in registry._REGISTRY.items() if p.factory.__module__.startswith("policies.")}
    monkeypatch.setattr(registry, "_REGISTRY", own)


@pytest.fixture
def tilt_registered(built_ins, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "tilt", registry.PluginType("scorer", _Tilt, _TiltParams))


def test_docs_plugins_page_is_the_generated_reference(built_ins):
    assert PAGE.read_text() == markdown(plugin_docs()), f"docs/plugins.md is stale: run `{REGENERATE}`"


def test_every_registered_plugin_is_in_the_reference_under_its_kind(built_ins):
    docs = plugin_docs()
    assert [(d.kind, d.name) for d in docs] == [
        (kind, name) for kind in ("filter", "scorer", "picker") for name in registry.registered(kind)
    ]
    page, terminal = markdown(docs), text(docs)
    for name in registry.registered():
        assert f"### `{name}`" in page
        assert f"\n  {name}    " in terminal


def test_every_built_in_plugin_and_parameter_is_described(built_ins):
    for doc in plugin_docs():
        assert doc.description, f"{doc.source} has no docstring"
        for param in doc.params:
            assert param.description, f"{doc.source} parameter `{param.name}` has no docstring"


def test_parameters_come_from_the_schema_with_type_default_and_description(built_ins):
    (affinity,) = [d for d in plugin_docs() if d.name == "prefix-affinity"]
    (param,) = affinity.params
    assert (param.name, param.type, param.default) == ("prefix_chars", "int", "512")
    assert param.description.startswith("How much of the prompt start identifies a shared prefix")
    assert "| `prefix_chars` | int | `512` | How much of the prompt start" in markdown(plugin_docs())


def test_a_plugin_registered_from_outside_shows_its_required_parameters(tilt_registered):
    (tilt,) = [d for d in plugin_docs() if d.name == "tilt"]
    assert tilt.kind == "scorer"
    assert tilt.description == "Backends of one pool score 1, the others `weight`."
    assert [(p.name, p.type, p.default, p.description) for p in tilt.params] == [
        ("pool", "string", None, "The pool whose backends score 1."),
        ("weight", "float", "0.5", "What every other backend scores."),
    ]
    page = markdown(plugin_docs())
    assert "| `pool` | string | required | The pool whose backends score 1. |" in page
    assert "Has required parameters: use it through a `plugins:` entry" in page
    assert "param pool: string, required" in text(plugin_docs())


def test_the_filters_said_to_run_first_are_the_ones_the_engine_runs_first():
    pool = PoolConfig(
        name="h100",
        vendor="nvidia",
        accelerator="h100",
        price_per_gpu_hour=2.0,
        backends=[BackendConfig(url="http://127.0.0.1:9000", models=["m"], max_model_len=8192)],
    )
    policy = parse_policy(
        textwrap.dedent(
            """
            routes:
              default: {filters: [exclude-saturated]}
            """
        ),
        "<test>",
    )
    route = PolicyEngine(policy, build_backends([pool]))._routes["default"]
    assert tuple(f.name for f in route.filters) == (*ALWAYS_RUN, "exclude-saturated")


def test_policy_plugins_prints_the_reference(built_ins, capsys):
    assert cli.main(["policy", "plugins"]) == 0
    assert capsys.readouterr().out == text(plugin_docs())
    assert cli.main(["policy", "plugins", "--markdown"]) == 0
    assert capsys.readouterr().out == PAGE.read_text()


def test_policy_plugins_imports_the_modules_named(capsys):
    assert cli.main(["policy", "plugins", "--import", "loadtest.round_robin"]) == 0
    out = capsys.readouterr().out
    assert "  round-robin    picker: round-robin    (loadtest.round_robin.RoundRobin)" in out
    assert cli.main(["policy", "plugins", "--import", "no_such_plugin_module"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "cannot import `no_such_plugin_module`" in captured.err
