"""`gateway.limits`, `gateway.connections` and the ledger spill settings: defaults, overrides, bad values."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.yamlfile import ConfigError
from gateway.config.settings import settings_from_text
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


def test_trusted_proxies() -> None:
    text = (
        "gateway:\n  trusted_proxies: [127.0.0.1/32, 10.0.0.0/8, '2001:db8::/32', 192.0.2.4]\n"
        "  proxy_protocol: required\n  forwarded_for: true\n" + POOLS
    )
    server = settings_from_text(text).server
    assert server.trusted_proxies == ["127.0.0.1/32", "10.0.0.0/8", "2001:db8::/32", "192.0.2.4"]
    assert (server.proxy_protocol, server.forwarded_for) == ("required", True)
    defaults = settings_from_text(POOLS).server
    assert (defaults.trusted_proxies, defaults.proxy_protocol, defaults.forwarded_for) == (
        [],
        "optional",
        False,
    )


@pytest.mark.parametrize(
    ("gateway", "line", "says"),
    [
        ("trusted_proxies:\n    - 10.0.0.0/8\n    - 10.0.0.1/8\n", 4, "has host bits set"),
        ("trusted_proxies:\n    - 10.0.0.0/33\n", 3, "10.0.0.0/33"),
        ("trusted_proxies:\n    - haproxy\n", 3, "`haproxy` is not an address or CIDR"),
        ("trusted_proxies: 10.0.0.0/8\n", 2, "Expected `array`"),
        ("proxy_protocol: always\n", 2, "proxy_protocol"),
        (
            "proxy_protocol: required\n",
            2,
            "gateway.proxy_protocol is honoured only from gateway.trusted_proxies",
        ),
        ("forwarded_for: true\n", 2, "gateway.forwarded_for is honoured only from gateway.trusted_proxies"),
    ],
)
def test_bad_trusted_proxies_name_the_line(gateway: str, line: int, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        settings_from_text(f"gateway:\n  {gateway}" + POOLS, "gw.yaml")
    assert f"gw.yaml:{line}:" in str(caught.value) and says in str(caught.value)
