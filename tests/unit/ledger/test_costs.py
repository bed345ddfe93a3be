"""The cost rules (gateway/ledger/costs.py) and the ledger section of the config."""

from __future__ import annotations

from dataclasses import asdict, replace

import pytest

from backends.yamlfile import ConfigError
from gateway.config.settings import settings_from_text
from gateway.ledger.costs import build_rows, format_cost_table, window_buckets
from tests.unit.ledger.test_ledger_contract import _backends


def test_split_rule_adds_back_up_to_spend() -> None:
    counters = {"nv-0": {"req": 3, "in": 700, "out": 300, "busy_us": 30_000_000}}
    (row, *_) = build_rows("backend", counters, {"nv-0": 60_000}, _backends(), output_weight=3.0)
    assert row.spend_usd == pytest.approx(0.06)
    spent = row.prompt_tokens * row.input_usd_per_mtok + row.completion_tokens * row.output_usd_per_mtok
    assert spent / 1e6 == pytest.approx(row.spend_usd)
    assert row.output_usd_per_mtok == pytest.approx(3 * row.input_usd_per_mtok)
    assert row.utilisation == pytest.approx(0.5)


def test_vendor_price_is_paid_over_gpu_hours_when_prices_differ() -> None:
    backends = _backends()
    backends[1].pool = replace(backends[0].pool, price_per_gpu_hour=1.2)
    (row,) = build_rows("vendor", {}, {"nv-0": 3_600_000, "nv-1": 3_600_000}, backends[:2], 4.0)
    assert row.price_per_gpu_hour == pytest.approx((3.6 + 1.2) / 2)
    assert row.requests == 0 and row.blended_usd_per_mtok is None


def test_windows() -> None:
    assert window_buckets("1m", 60, 125.0) == [60, 120]
    assert len(window_buckets("24h", 60, 0.0)) == 1441
    with pytest.raises(ValueError):
        window_buckets("2d", 60, 0.0)


def test_table_prints_dashes_for_unknowns() -> None:
    (row,) = build_rows("model", {"llama": {"req": 1, "in": 5, "cost_nusd": 10}}, {}, _backends(), 4.0)
    text = format_cost_table("model", "1h", [asdict(row)], "idle")
    assert "llama" in text and " - " in text and "costs by model, window 1h" in text


POOLS = """
pools:
  - {name: a, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1,
     backends: [{url: 'http://127.0.0.1:1', models: [m], max_model_len: 10}]}
"""


def test_ledger_settings() -> None:
    assert settings_from_text(POOLS).ledger.store == "auto"
    settings = settings_from_text(POOLS + "ledger: {redis_url: 'redis://127.0.0.1:6379/0', key_prefix: p1}")
    assert settings.ledger.redis_url and settings.ledger.key_prefix == "p1"
    with pytest.raises(ConfigError, match="redis_url"):
        settings_from_text(POOLS + "ledger: {store: redis}")
    with pytest.raises(ConfigError):
        settings_from_text(POOLS + "ledger: {redis_url: 'http://x'}")
