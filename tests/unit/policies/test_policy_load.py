"""Loading a policy: the engine validated is the engine run, once per version; reload reports what it sees."""

from __future__ import annotations

import logging
import os
import textwrap
from pathlib import Path

import pytest

from backends.yamlfile import ConfigError
from gateway.admin.policy_reload import PolicyWatcher
from gateway.app import SwitchyardPlugin
from gateway.config.settings import load_settings
from policies.config import load_policy
from policies.engine import PolicyEngine, load_engine
from tests.unit.policies.test_policy_config import _fleet

CONFIG = """\
policy: {file: policy.yaml}
ledger: {store: memory}
pools:
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 2.9
    backends: [{url: "http://127.0.0.1:9000", models: [m], max_model_len: 8192}]
  - name: mi300x
    vendor: amd
    accelerator: mi300x
    price_per_gpu_hour: 1.75
    backends: [{url: "http://127.0.0.1:9100", models: [m], max_model_len: 8192}]
"""
NVIDIA = "name: nvidia-only\nroutes:\n  default:\n    prefer: {vendor: nvidia}\n"
AMD = "name: amd-only\nroutes:\n  default:\n    prefer: {vendor: amd}\n"


@pytest.fixture
def built(monkeypatch: pytest.MonkeyPatch) -> list[PolicyEngine]:
    """Every PolicyEngine constructed during the test, in order."""
    engines: list[PolicyEngine] = []
    original = PolicyEngine.__init__

    def counting(self: PolicyEngine, *args: object, **kwargs: object) -> None:
        original(self, *args, **kwargs)  # type: ignore[arg-type]
        engines.append(self)

    monkeypatch.setattr(PolicyEngine, "__init__", counting)
    return engines


def _gateway(tmp_path: Path) -> tuple[SwitchyardPlugin, PolicyWatcher, Path]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(NVIDIA)
    config = tmp_path / "gateway.yaml"
    config.write_text(CONFIG)
    plugin = SwitchyardPlugin(load_settings(config))
    watcher = PolicyWatcher(policy, plugin.pipeline, plugin.pipeline.catalog, interval=60)
    return plugin, watcher, policy


def _rewrite(path: Path, text: str) -> None:
    """Write `text` with a new modification time, as an editor saving the file would."""
    path.write_text(text)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_the_gateway_runs_the_engine_its_settings_validated(tmp_path, built):
    plugin, _, _ = _gateway(tmp_path)
    assert len(built) == 1, "validating the config built the engine; starting the app built no other"
    assert plugin.pipeline.router is built[0]
    assert plugin.settings.policy is built[0]


def test_reload_installs_the_engine_that_validated_the_file(tmp_path, built):
    plugin, watcher, policy = _gateway(tmp_path)
    _rewrite(policy, AMD)
    assert watcher.check() is True
    assert len(built) == 2, "one build for the new version, none to validate it apart"
    assert plugin.pipeline.router is built[1]
    assert built[1].name == "amd-only"
    assert built[1].version != built[0].version


def test_a_file_saved_unchanged_builds_nothing(tmp_path, built):
    plugin, watcher, policy = _gateway(tmp_path)
    _rewrite(policy, NVIDIA)
    assert watcher.check() is False
    assert len(built) == 1
    assert plugin.pipeline.router is built[0]


def test_a_file_caught_while_it_is_written_is_read_when_whole(tmp_path, built):
    """`open(path, "w")` empties the file before it writes: a poll that lands in between must not refuse
    the empty file, which nobody meant as a policy."""
    plugin, watcher, policy = _gateway(tmp_path)
    _rewrite(policy, "")  # truncated, the write still to come
    settles: list[bool] = []

    def writer_finishes() -> None:  # the writer's write lands while the watcher settles
        settles.append(True)
        _rewrite(policy, AMD)

    watcher._settle = writer_finishes  # type: ignore[method-assign]
    assert watcher.check() is False
    assert settles == [True]
    assert watcher.rejected == 0 and watcher.last_error is None
    assert plugin.pipeline.router is built[0]
    del watcher._settle  # the real wait again
    assert watcher.check() is True, "the next poll reads the whole file"
    assert plugin.pipeline.router.name == "amd-only"
    assert watcher.rejected == 0


def test_a_file_that_stays_empty_is_refused(tmp_path, built):
    plugin, watcher, policy = _gateway(tmp_path)
    _rewrite(policy, "")
    assert watcher.check() is False
    assert watcher.rejected == 1 and watcher.last_error is not None
    assert plugin.pipeline.router is built[0], "the last good policy keeps serving"


def test_load_engine_is_what_policy_check_builds(tmp_path, built):
    policy = tmp_path / "p.yaml"
    policy.write_text(NVIDIA)
    engine = load_engine(policy, _fleet())
    assert built == [engine]
    assert engine.version == load_policy(policy).version


# --- defect 6: the watched file deleted; a YAML error on the last line -------------------------------


def test_deleting_the_policy_file_is_reported_and_cleared_when_it_is_back(tmp_path, built, caplog):
    plugin, watcher, policy = _gateway(tmp_path)
    _rewrite(policy, "routes: [")  # an older error, to be replaced
    assert watcher.check() is False
    assert watcher.last_error is not None and "invalid YAML" in watcher.last_error
    policy.unlink()
    with caplog.at_level(logging.WARNING, logger="switchyard.policy"):
        assert watcher.check() is False
    assert watcher.last_error is not None
    assert "policy file is gone" in watcher.last_error and "nvidia-only" in watcher.last_error
    assert any(
        "policy file is gone" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
    )
    assert plugin.pipeline.router is built[0], "the last good policy keeps serving"
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="switchyard.policy"):
        assert watcher.check() is False
    assert not caplog.records, "reported once, not at every poll"

    policy.write_text(AMD)  # back, valid
    assert watcher.check() is True
    assert watcher.last_error is None
    assert plugin.pipeline.router.name == "amd-only"


def test_a_deleted_file_restored_as_it_was_clears_the_error_without_a_build(tmp_path, built):
    _, watcher, policy = _gateway(tmp_path)
    policy.unlink()
    watcher.check()
    assert watcher.last_error is not None
    policy.write_text(NVIDIA)
    assert watcher.check() is False
    assert watcher.last_error is None
    assert len(built) == 1


def test_unclosed_yaml_on_the_only_line_names_that_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("{{{{\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.line == 1, str(info.value)
    assert str(info.value).startswith(f"{path}:1: invalid YAML")


def test_unclosed_mapping_before_trailing_blank_lines_names_its_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: x\nroutes: {default: {}\n\n\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.line == 2, str(info.value)


# --- defect 7: selectors that match nothing; enum values ---------------------------------------------


def _policy(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def test_a_selector_matching_no_pool_is_a_warning_naming_its_line(tmp_path):
    path = _policy(
        tmp_path,
        """
        routes:
          default:
            prefer: {accelerator: mi250}
            fallback: [{vendor: amd}, {pool: h200}]
        """,
    )
    engine = load_engine(path, _fleet())
    assert engine.warnings == [
        f"{path}:3: route `default`: prefer {{accelerator: mi250}} matches no pool "
        "(pools: h100 (nvidia h100), mi300x (amd mi300x))",
        f"{path}:4: route `default`: fallback {{pool: h200}} matches no pool "
        "(pools: h100 (nvidia h100), mi300x (amd mi300x))",
    ]


def test_a_selector_matching_no_pool_is_logged_when_the_gateway_loads(tmp_path, caplog):
    (tmp_path / "policy.yaml").write_text(
        "routes:\n  default:\n    prefer: {accelerator: mi250}\n    fallback: any\n"
    )
    config = tmp_path / "gateway.yaml"
    config.write_text(CONFIG)
    with caplog.at_level(logging.WARNING, logger="switchyard.policy"):
        load_settings(config)
    assert any("prefer {accelerator: mi250} matches no pool" in r.getMessage() for r in caplog.records)


def test_an_invalid_enum_lists_the_allowed_values(tmp_path):
    path = _policy(tmp_path, "routes:\n  default:\n    prefer: [{vendor: AMD}]\n    fallback: anywhere\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.line == 3
    assert info.value.hint == "one of: amd, nvidia"
    path.write_text("routes:\n  default:\n    fallback: anywhere\n")
    with pytest.raises(ConfigError) as info:
        load_policy(path)
    assert info.value.hint == "one of: any, none"
