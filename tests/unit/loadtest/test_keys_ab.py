"""The keys A/B bench with `--sdk-headers`: the installed SDK's own headers, written into wrk's script."""

from __future__ import annotations

import json

import pytest

from loadtest.bench.keys import _script
from loadtest.bench.keys_ab import _with_headers, format_table, main, sdk_headers


def test_the_sdk_headers_are_the_installed_sdks_own_but_the_key_and_content_type() -> None:
    headers = sdk_headers()
    names = {name.lower() for name in headers}
    assert {"x-stainless-lang", "x-stainless-retry-count", "user-agent", "accept"} <= names
    assert not names & {"authorization", "content-type"}  # wrk's script sets those itself
    assert all(isinstance(value, str) and value for value in headers.values())
    assert len(headers) >= 8


def test_the_headers_are_added_to_wrks_script_as_lua_strings() -> None:
    script = _with_headers(_script("sy-k"), {"X-Stainless-OS": 'Li"nux', "Accept": "application/json"})
    assert 'wrk.headers["Authorization"] = "Bearer sy-k"' in script
    assert 'wrk.headers["X-Stainless-OS"] = "Li\\"nux"' in script  # quoted, not spliced raw
    assert script.endswith('wrk.headers["Accept"] = "application/json"\n')
    assert _with_headers("x\n", {}) == "x\n"


def test_the_table_says_when_the_sdks_headers_were_sent() -> None:
    medians = {
        "rps": 100.0,
        "p50_ms": 1.0,
        "gateway_cpu_us_per_req": 200.0,
        "calls_per_script": 20.0,
        "script_us": 100.0,
        "redis_cpu_us_per_req": 40.0,
    }
    summary = {
        "connections": 8,
        "extra_headers": 10,
        "this_vs_base_rps": 1.0,
        "this_vs_base_p50": 1.0,
        "this_vs_base_cpu": 0.99,
        "rounds_rps": [1.0],
        "rounds_p50": [1.0],
        "rounds_cpu": [0.99],
        "medians": {"base": medians, "this": medians},
    }
    assert "8 connections, 10 headers of the SDK's more: req/s" in format_table(summary)
    assert "8 connections: req/s" in format_table({**summary, "extra_headers": 0})
    json.dumps(summary)  # what --json writes


def test_bad_arguments_are_refused_before_anything_starts() -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--base", "/nonexistent", "--rounds", "0", "--sdk-headers"])
    assert refused.value.code == 2
