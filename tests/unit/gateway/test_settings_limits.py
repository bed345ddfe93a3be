"""`gateway.limits`, `gateway.connections` and the ledger spill settings: defaults, overrides, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.yamlfile import ConfigError
from gateway.settings import settings_from_text
from tests.support import ONE_POOL as POOLS


def test_defaults() -> None:
    settings = settings_from_text(POOLS)
    assert settings.server.limits.max_n == 128
    assert settings.server.connections.header_timeout == 10.0
    assert settings.server.connections.max_header_value_bytes == 8190
    assert settings.ledger.spill is True and settings.ledger.spill_path is None


def test_overrides() -> None:
    text = (
        "gateway:\n  limits: {max_n: 4, max_prompt_chars: 1000}\n"
        "  connections: {header_timeout: 2.5, max_per_client: 3}\n"
        "ledger: {spill_path: /tmp/x.spill}\n" + POOLS
    )
    settings = settings_from_text(text)
    assert (settings.server.limits.max_n, settings.server.limits.max_prompt_chars) == (4, 1000)
    assert settings.server.connections.header_timeout == 2.5
    assert settings.server.connections.max_per_client == 3
    assert settings.ledger.spill_path == "/tmp/x.spill"


@pytest.mark.parametrize(
    "gateway",
    [
        "limits: {max_n: 0}",
        "limits: {max_tokenz: 5}",
        "connections: {header_timeout: 0}",
        "connections: {max_header_bytes: 10}",
    ],
)
def test_bad_values_name_the_line(gateway: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_text(f"gateway:\n  {gateway}\n" + POOLS, "gw.yaml")
    assert "gw.yaml:2" in str(caught.value)
