"""Config loading: a good file becomes Settings; each operator mistake names the file, line and fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.yamlfile import ConfigError
from gateway.config.settings import Settings, Timeouts, load_settings

VALID = """\
gateway:
  port: 9000
  timeouts:
    first_byte: 30
pools:
  - name: mi300x
    vendor: amd
    accelerator: MI300X
    price_per_gpu_hour: 2.5
    gpus_per_backend: 2
    labels: {zone: a}
    backends:
      - url: http://127.0.0.1:8001/
        models: [llama-8b, qwen-7b]
        max_model_len: 8192
      - url: http://127.0.0.1:8002
        models: [llama-8b]
        max_model_len: 4096
        name: amd-big
        api_key_env: SWITCHYARD_TEST_KEY
  - name: h100
    vendor: nvidia
    accelerator: h100
    price_per_gpu_hour: 3
    backends:
      - url: http://127.0.0.1:8003/v1/
        models: [llama-8b]
        max_model_len: 16384
"""

SECRET = "sk-test-secret-value-123"


def _write(tmp_path: Path, text: str, name: str = "switchyard.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _error(tmp_path: Path, text: str) -> tuple[ConfigError, Path]:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value, path


def _pool(backends: str = "", **fields: str) -> str:
    """One pool in YAML, starting at line 2 of the file (after `pools:`)."""
    values = {
        "name": "p",
        "vendor": "amd",
        "accelerator": "mi300x",
        "price_per_gpu_hour": "2",
        **fields,
    }
    lines = ["pools:"]
    first = True
    for key, value in values.items():
        lines.append(("  - " if first else "    ") + f"{key}: {value}")
        first = False
    if backends:
        lines.append("    backends:")
        lines.append(backends.rstrip("\n"))
    return "\n".join(lines) + "\n"


GOOD_BACKEND = """\
      - url: http://127.0.0.1:8001
        models: [m]
        max_model_len: 4096"""


def _assert_where(error: ConfigError, path: Path, line: int | None) -> None:
    text = str(error)
    if line is None:
        assert text.startswith(f"{path}: "), text
    else:
        assert text.startswith(f"{path}:{line}: "), text
    assert error.source == str(path)
    assert error.line == line


# --- a valid file --------------------------------------------------------------------------------------


def test_valid_config_loads_pools_backends_and_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SWITCHYARD_TEST_KEY", SECRET)
    settings = load_settings(_write(tmp_path, VALID))

    assert isinstance(settings, Settings)
    assert settings.source == str(tmp_path / "switchyard.yaml")
    assert settings.server.port == 9000
    assert settings.server.host == "127.0.0.1"
    assert settings.server.timeouts == Timeouts(connect=3.0, first_byte=30.0, between_chunks=60.0)
    assert settings.server.health.interval == 5.0
    assert settings.server.max_connections_per_backend == 4096

    assert [p.name for p in settings.pools] == ["mi300x", "h100"]
    assert settings.pools[1].gpus_per_backend == 1
    assert settings.pools[1].labels == {}
    assert settings.models == ["llama-8b", "qwen-7b"]

    names = [b.name for b in settings.backends]
    assert names == ["mi300x-0", "amd-big", "h100-0"]
    first, named, nvidia = settings.backends
    assert first.url == "http://127.0.0.1:8001"
    assert nvidia.url == "http://127.0.0.1:8003/v1"
    assert first.models == frozenset({"llama-8b", "qwen-7b"})
    assert first.max_model_len == 8192
    assert first.vendor == "amd" and nvidia.vendor == "nvidia"
    assert first.pool.accelerator == "mi300x"  # lower-cased
    assert first.pool is named.pool
    assert first.pool.labels == {"zone": "a"}
    assert first.pool.backend_price_per_second == pytest.approx(2.5 * 2 / 3600)
    assert first.api_key is None
    assert named.api_key == SECRET
    assert first.healthy and first.inflight == 0


def test_api_key_is_not_shown_in_repr(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SWITCHYARD_TEST_KEY", SECRET)
    settings = load_settings(_write(tmp_path, VALID))
    named = settings.backends[1]
    assert named.api_key == SECRET
    assert SECRET not in repr(named)
    assert SECRET not in repr(settings)
    assert "amd-big" in repr(named)


# --- operator mistakes -----------------------------------------------------------------------------------


def test_invalid_yaml_syntax(tmp_path: Path):
    error, path = _error(tmp_path, "pools:\n  - name: a\n    vendor: amd: x\n")
    _assert_where(error, path, 3)
    assert "invalid YAML" in str(error)


def test_tab_indentation_is_invalid_yaml(tmp_path: Path):
    error, path = _error(tmp_path, "pools:\n  - name: a\n\tvendor: amd\n")
    _assert_where(error, path, 3)
    assert "invalid YAML" in str(error)


def test_duplicate_key(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + "    vendor: nvidia\n")
    _assert_where(error, path, 10)
    assert "duplicate key `vendor`" in str(error)


def test_wrong_vendor(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND, vendor="intel"))
    _assert_where(error, path, 3)
    assert "'intel'" in str(error)
    assert "vendor" in str(error)


def test_missing_models(tmp_path: Path):
    backend = "      - url: http://127.0.0.1:8001\n        max_model_len: 4096"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 7)
    assert "missing required field `models`" in str(error)
    assert "pools[0].backends[0]" in str(error)


def test_empty_models_list(tmp_path: Path):
    backend = "      - url: http://127.0.0.1:8001\n        models: []\n        max_model_len: 4096"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 8)
    assert "models" in str(error)


def test_unknown_field_points_at_the_typo(tmp_path: Path):
    backend = "      - url: http://127.0.0.1:8001\n        models: [m]\n        max_model_length: 4096"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 9)
    assert "unknown field `max_model_length`" in str(error)


def test_unknown_top_level_field(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + "gatway:\n  port: 1\n")
    _assert_where(error, path, 10)
    assert "unknown field `gatway`" in str(error)


def test_negative_price(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND, price_per_gpu_hour="-2"))
    _assert_where(error, path, 5)
    assert ">= 0" in str(error)
    assert "price_per_gpu_hour" in str(error)


def test_price_as_string_is_rejected(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND, price_per_gpu_hour='"2.5"'))
    _assert_where(error, path, 5)
    assert "Expected `float`" in str(error)


def test_empty_backends_list(tmp_path: Path):
    error, path = _error(tmp_path, _pool() + "    backends: []\n")
    _assert_where(error, path, 6)
    assert "length >= 1" in str(error)
    assert "backends" in str(error)


def test_missing_backends(tmp_path: Path):
    error, path = _error(tmp_path, _pool())
    _assert_where(error, path, 2)
    assert "missing required field `backends`" in str(error)


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:8001", "127.0.0.1:8001", "http://", "http://a b"])
def test_bad_url(tmp_path: Path, url: str):
    backend = f"      - models: [m]\n        max_model_len: 4096\n        url: '{url}'"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 9)
    assert "pools[0].backends[0].url" in str(error)


def test_zero_max_model_len(tmp_path: Path):
    backend = "      - url: http://127.0.0.1:8001\n        models: [m]\n        max_model_len: 0"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 9)
    assert ">= 1" in str(error)


def test_bad_timeout(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + "gateway:\n  timeouts:\n    connect: 0\n")
    _assert_where(error, path, 12)
    assert "gateway.timeouts.connect" in str(error)


def test_duplicate_pool_name(tmp_path: Path):
    text = _pool(GOOD_BACKEND) + _pool(GOOD_BACKEND).removeprefix("pools:\n")
    error, path = _error(tmp_path, text)
    _assert_where(error, path, 10)
    assert "pool name `p` is used twice" in str(error)


def test_duplicate_backend_name_when_name_comes_first(tmp_path: Path):
    backends = (
        "      - name: b1\n        url: http://127.0.0.1:8001\n        models: [m]\n"
        "        max_model_len: 9\n"
        "      - name: b1\n        url: http://127.0.0.1:8002\n        models: [m]\n"
        "        max_model_len: 9"
    )
    error, path = _error(tmp_path, _pool(backends))
    _assert_where(error, path, 11)
    assert "backend name `b1` is used twice" in str(error)


def test_duplicate_backend_name_across_pools_with_generated_name(tmp_path: Path):
    # Pool `p` backend 0 is named `p-0` implicitly; a backend in another pool claims the same name.
    second = _pool(
        "      - name: p-0\n        url: http://127.0.0.1:8002\n        models: [m]\n"
        "        max_model_len: 9",
        name="q",
    ).removeprefix("pools:\n")
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + second)
    _assert_where(error, path, 15)
    assert "backend name `p-0` is used twice" in str(error)


def test_duplicate_backend_name_points_at_the_name_line(tmp_path: Path):
    backends = (
        "      - url: http://127.0.0.1:8001\n        models: [m]\n"
        "        max_model_len: 9\n        name: b1\n"
        "      - url: http://127.0.0.1:8002\n        models: [m]\n"
        "        max_model_len: 9\n        name: b1"
    )
    error, path = _error(tmp_path, _pool(backends))
    assert "backend name `b1` is used twice" in str(error)
    _assert_where(error, path, 14)  # the second `name: b1`; got 11 (its `- url:` line)


def test_api_key_env_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("SWITCHYARD_UNSET_KEY", raising=False)
    backend = GOOD_BACKEND + "\n        api_key_env: SWITCHYARD_UNSET_KEY"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 10)
    assert "`SWITCHYARD_UNSET_KEY` is not set" in str(error)
    assert "(hint: " in str(error)
    assert error.hint and "export" in error.hint


def test_api_key_env_bad_name(tmp_path: Path):
    backend = GOOD_BACKEND + "\n        api_key_env: 1-bad"
    error, path = _error(tmp_path, _pool(backend))
    _assert_where(error, path, 10)
    assert "api_key_env" in str(error)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "42\n"])
def test_top_level_not_a_mapping(tmp_path: Path, text: str):
    error, path = _error(tmp_path, text)
    _assert_where(error, path, 1)
    assert "must be a mapping" in str(error)


def test_top_level_not_a_mapping_after_a_comment(tmp_path: Path):
    error, path = _error(tmp_path, "# switchyard config\n- a\n")
    assert "must be a mapping" in str(error)
    _assert_where(error, path, 2)  # got 1, the comment line


@pytest.mark.parametrize("text", ["", "\n\n", "# nothing here\n"])
def test_empty_file(tmp_path: Path, text: str):
    error, path = _error(tmp_path, text)
    _assert_where(error, path, None)
    assert "missing required field `pools`" in str(error)


def test_empty_pools_list(tmp_path: Path):
    error, path = _error(tmp_path, "pools: []\n")
    _assert_where(error, path, 1)
    assert "length >= 1" in str(error)


def test_unreadable_path(tmp_path: Path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    _assert_where(info.value, path, None)
    assert "cannot read config file" in str(info.value)
    assert "No such file" in str(info.value)


def test_directory_path(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    _assert_where(info.value, tmp_path, None)
    assert "cannot read config file" in str(info.value)


# --- responses: ------------------------------------------------------------------------------------------


def test_responses_section_loads_with_defaults_and_overrides(tmp_path: Path):
    default = load_settings(_write(tmp_path, _pool(GOOD_BACKEND)))
    assert (default.responses.store, default.responses.ttl_s) == ("auto", 30 * 24 * 3600.0)
    text = _pool(GOOD_BACKEND) + "responses:\n  store: memory\n  ttl_s: 60\n  max_bytes_per_key: 4096\n"
    options = load_settings(_write(tmp_path, text, "b.yaml")).responses
    assert (options.store, options.ttl_s, options.max_bytes_per_key) == ("memory", 60.0, 4096)
    assert (default.responses.response_bytes_bound, options.response_bytes_bound) == (16 * 1024 * 1024, 4096)


def test_responses_store_redis_needs_the_ledgers_redis_url(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + "responses:\n  store: redis\n")
    _assert_where(error, path, 11)
    assert "ledger.redis_url" in str(error)


def test_responses_entry_bound_within_the_key_quota(tmp_path: Path):
    text = _pool(GOOD_BACKEND) + "responses:\n  max_bytes_per_key: 4096\n  max_response_bytes: 8192\n"
    error, _ = _error(tmp_path, text)
    assert "max_response_bytes" in str(error) and "responses" in str(error)


def test_responses_unknown_key_points_at_it(tmp_path: Path):
    error, path = _error(tmp_path, _pool(GOOD_BACKEND) + "responses:\n  ttl: 5\n")
    _assert_where(error, path, 11)


def test_worker_balance_defaults_to_least_connections_and_refuses_unknown_modes(tmp_path: Path) -> None:
    pools = _pool(GOOD_BACKEND)
    assert load_settings(_write(tmp_path, pools)).server.worker_balance == "least_connections"
    chosen = load_settings(_write(tmp_path, "gateway:\n  worker_balance: reuseport\n" + pools))
    assert chosen.server.worker_balance == "reuseport"
    error, path = _error(tmp_path, "gateway:\n  worker_balance: round_robin\n" + pools)
    _assert_where(error, path, 2)
    assert "Invalid enum value 'round_robin'" in str(error) and "gateway.worker_balance" in str(error)
