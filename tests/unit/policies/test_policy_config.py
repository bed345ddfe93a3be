"""Policy files: every mistake an operator can make is a ConfigError naming the file and the line to fix."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from backends.models import Backend, BackendConfig, PoolConfig, build_backends
from backends.yamlfile import ConfigError
from gateway.cli import main as cli
from policies.config import load_policy
from policies.engine import PolicyEngine
from policies.presets import PRESETS_DIR, preset_names

MODEL = "m"


def _fleet() -> list[Backend]:
    """Two H100 and two MI300X backends."""
    pools = [
        PoolConfig(
            name=name,
            vendor=vendor,
            accelerator=name,
            price_per_gpu_hour=price,
            backends=[
                BackendConfig(url=f"http://127.0.0.1:{port + i}", models=[MODEL], max_model_len=32768)
                for i in range(2)
            ],
        )
        for name, vendor, price, port in (("h100", "nvidia", 2.9, 9000), ("mi300x", "amd", 1.75, 9100))
    ]
    return build_backends(pools)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "policy.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return path


def _line_of(path: Path, fragment: str, occurrence: int = 1) -> int:
    """1-based line of the `occurrence`-th line containing `fragment`."""
    seen = 0
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if fragment in line:
            seen += 1
            if seen == occurrence:
                return number
    raise AssertionError(f"{fragment!r} not in {path}")


def _load_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    return info.value


def _engine_error(path: Path) -> ConfigError:
    loaded = load_policy(path)  # the file itself is well formed
    with pytest.raises(ConfigError) as info:
        PolicyEngine(loaded, _fleet())
    return info.value


def _assert_points_at(error: ConfigError, path: Path, line: int, *words: str) -> None:
    assert error.source == str(path)
    assert error.line == line, str(error)
    assert str(error).startswith(f"{path}:{line}: "), str(error)
    for word in words:
        assert word in str(error), str(error)


# --- structure ---------------------------------------------------------------------------------------


def test_invalid_yaml(tmp_path):
    path = _write(
        tmp_path,
        """
        name: x
        routes:
          default: {prefer: any
        """,
    )
    error = _load_error(path)
    assert error.source == str(path)
    assert error.line is not None and error.line >= _line_of(path, "default:")
    assert "invalid YAML" in str(error)
    assert str(error).startswith(f"{path}:{error.line}: ")


def test_duplicate_key(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default: {}
        name: a
        name: b
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "name: b"), "duplicate key `name`")


def test_top_level_not_a_mapping(tmp_path):
    path = _write(tmp_path, "- routes\n- classes\n")
    _assert_points_at(_load_error(path), path, 1, "mapping", "`routes`")


def test_unknown_top_level_key(tmp_path):
    path = _write(
        tmp_path,
        """
        name: x
        clases: []
        routes:
          default: {}
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "clases:"), "unknown field `clases`")


def test_missing_routes(tmp_path):
    path = _write(
        tmp_path,
        """
        name: x
        description: no routes at all
        """,
    )
    _assert_points_at(_load_error(path), path, 1, "missing required field `routes`")


def test_no_default_route(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
        routes:
          chat: {prefer: any}
        """,
    )
    error = _load_error(path)
    # the `routes` block (its first line): where the missing route goes
    _assert_points_at(error, path, _line_of(path, "chat: {prefer"), "`routes` has no `default`")
    assert error.hint is not None and "default:" in error.hint


def test_route_for_an_undefined_class(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
        routes:
          chat: {}
          batchh: {prefer: any}
          default: {}
        """,
    )
    error = _load_error(path)
    _assert_points_at(error, path, _line_of(path, "batchh:"), "route `batchh`", "not defined")
    assert error.hint is not None and "classes:" in error.hint


def test_class_without_a_route(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
          - name: batch
            when: {n: {gt: 1}}
        routes:
          chat: {}
          default: {}
        """,
    )
    error = _load_error(path)
    _assert_points_at(error, path, _line_of(path, "name: batch"), "class `batch` has no route")
    assert error.hint == "add `batch:` under `routes:`"


def test_class_named_default(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
          - name: default
            when: {stream: false}
        routes:
          chat: {}
          default: {}
        """,
    )
    error = _load_error(path)
    _assert_points_at(error, path, _line_of(path, "name: default"), "`default`", "no rule")
    assert error.hint is not None and "another name" in error.hint


def test_class_without_when(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
          - name: batch
            description: forgot the rule
        routes:
          chat: {}
          batch: {}
          default: {}
        """,
    )
    error = _load_error(path)
    _assert_points_at(error, path, _line_of(path, "name: batch"), "class `batch` has no `when`")
    assert error.hint is not None and "when:" in error.hint


def test_duplicate_class_name(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
          - name: chat
            when: {priority: high}
        routes:
          chat: {}
          default: {}
        """,
    )
    _assert_points_at(
        _load_error(path), path, _line_of(path, "name: chat", 2), "class `chat` is defined twice"
    )


def test_unknown_condition_field_points_at_the_key(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: long
            when:
              stream: true
              prompt_token: {gt: 8000}
        routes:
          long: {}
          default: {}
        """,
    )
    _assert_points_at(
        _load_error(path), path, _line_of(path, "prompt_token:"), "unknown field `prompt_token`", "when"
    )


def test_wrong_threshold_type(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: long
            when:
              stream: true
              prompt_tokens: {gt: "big"}
        routes:
          long: {}
          default: {}
        """,
    )
    _assert_points_at(
        _load_error(path), path, _line_of(path, "prompt_tokens:"), "got `str`", "prompt_tokens.gt"
    )


def test_unknown_threshold_op(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: long
            when:
              prompt_tokens:
                above: 8000
        routes:
          long: {}
          default: {}
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "above:"), "unknown field `above`")


def test_bad_vendor_points_inside_its_route(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
        routes:
          default:
            prefer: any
          chat:
            prefer:
              vendor: intel
        """,
    )
    error = _load_error(path)
    assert error.line != _line_of(path, "routes:")
    _assert_points_at(error, path, _line_of(path, "vendor: intel"), "'intel'", "routes.chat.prefer.vendor")


@pytest.mark.parametrize("weight", ["0", "-1"])
def test_non_positive_strategy_weight(tmp_path, weight):
    path = _write(
        tmp_path,
        f"""
        routes:
          default:
            strategy:
              cheapest: {weight}
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "cheapest:"), "> 0", "routes.default.strategy")


def test_non_positive_strategy_weight_points_at_its_own_key(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            strategy:
              least-outstanding: 1
              cheapest: -1
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "cheapest: -1"), "> 0")


def test_slo_ttft_zero(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            prefer: any
            slo:
              tpot_ms: 50
              ttft_ms: 0
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "ttft_ms: 0"), "> 0", "slo.ttft_ms")


def test_saturation_kv_usage_above_one(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            saturation:
              max_waiting: 4
              max_kv_cache_usage: 1.5
        """,
    )
    _assert_points_at(
        _load_error(path), path, _line_of(path, "max_kv_cache_usage"), "<= 1", "max_kv_cache_usage"
    )


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("max_seqs", "0", ">= 1"),
        ("max_seqs", "-4", ">= 1"),
        ("max_seqs", "1.5", "Expected `int"),
        ("max_seqs", "many", "Expected `int"),
        ("max_tpot_ms", "0", "> 0"),
        ("max_tpot_ms", "-60", "> 0"),
        ("max_tpot_ms", ".nan", "> 0"),
        ("max_tpot_ms", "slow", "Expected `float"),
        ("max_slowdown", "1", "> 1"),  # 1x its light load: every backend with work in flight is past it
        ("max_slowdown", "0.5", "> 1"),
        ("max_slowdown", ".nan", "> 1"),
        ("max_slowdown", "6x", "Expected `float"),
    ],
)
def test_saturation_marks_must_be_positive(tmp_path, field, value, expected):
    path = _write(
        tmp_path,
        f"""
        routes:
          default:
            saturation:
              max_waiting: 4
              {field}: {value}
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, field), expected, field)


def test_unknown_route_field(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            prefer: any
            stratgy: {cheapest: 1}
        """,
    )
    _assert_points_at(_load_error(path), path, _line_of(path, "stratgy"), "unknown field `stratgy`")


# --- plugin references (checked by the engine) --------------------------------------------------------


def test_unknown_scorer_lists_known_ones(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            strategy:
              least-outstanding: 1
              cheapest-ish: 2
        """,
    )
    error = _engine_error(path)
    _assert_points_at(error, path, _line_of(path, "cheapest-ish"), "unknown scorer `cheapest-ish`")
    assert error.hint is not None
    for known in (
        "cheapest",
        "kv-headroom",
        "least-outstanding",
        "prefix-affinity",
        "slo-predicted",
        "fastest-predicted",
    ):
        assert known in error.hint
    assert "healthy" not in error.hint  # a filter is not a scorer


def test_unknown_filter(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            filters:
              - healthy
              - cheapest
        """,
    )
    error = _engine_error(path)
    _assert_points_at(error, path, _line_of(path, "- cheapest"), "unknown filter `cheapest`")
    assert error.hint is not None and "exclude-saturated" in error.hint


def test_unknown_picker(tmp_path):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            prefer: any
            picker: random
        """,
    )
    error = _engine_error(path)
    _assert_points_at(error, path, _line_of(path, "picker: random"), "unknown picker `random`")
    assert error.hint is not None and "best-score" in error.hint


def test_unknown_plugin_type(tmp_path):
    path = _write(
        tmp_path,
        """
        plugins:
          - type: prefix-affinity
            name: docs
          - type: magic
            name: m
        routes:
          default: {}
        """,
    )
    error = _engine_error(path)
    _assert_points_at(error, path, _line_of(path, "type: magic"), "unknown plugin type `magic`")
    assert error.hint is not None and "prefix-affinity" in error.hint


def test_bad_plugin_params(tmp_path):
    path = _write(
        tmp_path,
        """
        plugins:
          - type: prefix-affinity
            name: docs
            params: {prefix_chars: "x"}
        routes:
          default: {}
        """,
    )
    error = _engine_error(path)
    _assert_points_at(
        error, path, _line_of(path, "params:"), "bad params for `prefix-affinity`", "prefix_chars"
    )


def test_params_for_a_plugin_that_takes_none(tmp_path):
    path = _write(
        tmp_path,
        """
        plugins:
          - type: cheapest
            params: {x: 1}
        routes:
          default: {}
        """,
    )
    _assert_points_at(_engine_error(path), path, _line_of(path, "params:"), "takes no params")


def test_import_of_a_missing_module(tmp_path):
    path = _write(
        tmp_path,
        """
        imports:
          - json
          - no_such_switchyard_plugin_module
        routes:
          default: {}
        """,
    )
    _assert_points_at(
        _engine_error(path),
        path,
        _line_of(path, "no_such_switchyard_plugin_module"),
        "cannot import `no_such_switchyard_plugin_module`",
    )


def test_import_of_a_broken_module(tmp_path, monkeypatch):
    (tmp_path / "switchyard_broken_plugin_mod.py").write_text("x = (\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _write(
        tmp_path,
        """
        imports:
          - switchyard_broken_plugin_mod
        routes:
          default: {}
        """,
    )
    _assert_points_at(
        _engine_error(path), path, _line_of(path, "switchyard_broken_plugin_mod"), "cannot import"
    )


# --- presets and warnings -----------------------------------------------------------------------------


def test_presets_are_the_four_shipped():
    assert preset_names() == ["balanced", "capacity-first", "cheapest", "latency-first"]


@pytest.mark.parametrize("name", ["balanced", "capacity-first", "cheapest", "latency-first"])
def test_presets_load_and_build_without_warnings(name):
    loaded = load_policy(PRESETS_DIR / f"{name}.yaml")
    engine = PolicyEngine(loaded, _fleet())
    assert engine.name == name
    assert engine.warnings == []
    assert "default" in loaded.policy.routes


def test_route_selecting_no_pool_warns_with_its_line(tmp_path):
    path = _write(
        tmp_path,
        """
        classes:
          - name: chat
            when: {stream: true}
        routes:
          default: {prefer: any}
          chat: {prefer: {vendor: nvidia, labels: {rack: r9}}}
        """,
    )
    engine = PolicyEngine(load_policy(path), _fleet())
    assert engine.warnings == [
        f"{path}:{_line_of(path, 'chat: {prefer')}: route `chat` selects no configured pool"
    ]


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    error = _load_error(path)
    assert error.source == str(path)
    assert "cannot read policy file" in str(error)


# --- the CLI ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["balanced", "capacity-first", "cheapest", "latency-first"])
def test_cli_check_presets(name, capsys):
    assert cli.main(["policy", "check", name]) == 0
    out = capsys.readouterr()
    assert f"ok: policy `{name}`" in out.out
    assert "warning" not in out.out
    assert out.err == ""


def test_cli_check_bad_file(tmp_path, capsys):
    path = _write(
        tmp_path,
        """
        routes:
          default:
            prefer: {vendor: intel}
        """,
    )
    assert cli.main(["policy", "check", str(path)]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith(f"error: {path}:{_line_of(path, 'vendor: intel')}: ")
    assert "intel" in out.err


def test_saturation_max_tpot_ms_takes_milliseconds(tmp_path):
    good = _write(tmp_path, "routes:\n  default:\n    saturation: {max_tpot_ms: 62.5}\n")
    assert load_policy(good).policy.routes["default"].saturation.max_tpot_ms == 62.5


def test_saturation_max_slowdown_takes_a_ratio(tmp_path):
    good = _write(tmp_path, "routes:\n  default:\n    saturation: {max_slowdown: 4.5}\n")
    assert load_policy(good).policy.routes["default"].saturation.max_slowdown == 4.5
