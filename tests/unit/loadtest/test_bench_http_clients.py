"""Smoke test for loadtest.bench.http_clients: payloads, table, and one tiny end-to-end run.

The end-to-end run uses the pure-Python fallbacks (aiohttp upstream, aiohttp load generator), so it
needs neither nginx nor wrk, and lasts well under 15 s.
"""

from __future__ import annotations

import json
import math
import sys
import time

import pytest

from loadtest.bench._util import pick_cpus, process_cpu_split, session_cpu_seconds, session_cpu_split
from loadtest.bench.http_clients import payloads, run
from loadtest.processes import ProcessGroup

# measures time or capacity on the whole machine: `make test` runs it by itself (pyproject.toml)
pytestmark = pytest.mark.alone


def test_payloads_are_valid_answers() -> None:
    request = json.loads(payloads.chat_request(stream=True))
    assert request["stream"] is True
    assert len(request["messages"][1]["content"].split()) > 120  # ~200 tokens
    payloads.check_response("json", 200, payloads.completion_body())
    payloads.check_response("stream", 200, payloads.sse_body())
    with pytest.raises(RuntimeError):
        payloads.check_response("stream", 200, payloads.sse_body()[:-20])


def test_parse_args_defaults_and_limits() -> None:
    config, json_path = run.parse_args([])
    assert (config.duration, config.connections, config.server) == (10.0, 64, "uvicorn")
    assert config.clients == ("httpx", "aiohttp", "switchyard") and json_path is None
    with pytest.raises(SystemExit):
        run.parse_args(["--duration", "0"])


def test_session_cpu_of_a_pinned_child(tmp_path) -> None:
    # Spins for 0.4 s of its own CPU time (not wall time), so a busy machine only makes it slower.
    # The clock is read between sums: reading it is a system call, the sums are user time.
    spin = "import time\nwhile time.process_time() < 0.4: sum(range(20000))\ntime.sleep(30)"
    group = ProcessGroup(tmp_path)
    child = group.start("spin", [sys.executable, "-c", spin], cpu=pick_cpus()[0])
    try:
        deadline = time.monotonic() + 20
        while session_cpu_seconds(child.pid) <= 0.3 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert child.alive()
        assert session_cpu_seconds(child.pid) > 0.3
        # A spin in Python is user time: the split puts it there, and its parts add up to the whole
        # (read once the spin is over, ~0.4 s, so both readings see the same counts).
        while session_cpu_seconds(child.pid) < 0.38 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.1)
        user, system = session_cpu_split(child.pid)
        assert user > 0.2 and system < user and user + system == session_cpu_seconds(child.pid)
        assert process_cpu_split(child.pid) == (user, system)  # one process in its session
    finally:
        group.stop(child)
    assert not child.alive() and group.children == []


def test_tiny_run_with_fallbacks(tmp_path) -> None:
    config = run.Config(duration=1.0, warmup=0.0, connections=4, upstream="aiohttp", loadgen="aiohttp")
    report = run.run_benchmark(config)

    assert report["environment"]["upstream"] == "aiohttp"
    assert report["environment"]["loadgen"] == "aiohttp"
    for client in payloads.CLIENTS:
        for mode in payloads.MODES:
            phase = report["results"][client][mode]
            assert phase["requests"] > 0 and phase["errors"] == 0, phase
            for key in ("rps", "p50_ms", "p99_ms", "cpu_us_per_req"):
                assert phase[key] > 0, (client, mode, key, phase)
    assert set(report["ratios_over_httpx"]) == {"aiohttp", "switchyard"}
    for by_mode in report["ratios_over_httpx"].values():
        for ratios in by_mode.values():
            assert all(math.isfinite(v) and v > 0 for v in ratios.values())
    table = run.format_table(report)
    assert "aiohttp/httpx" in table and "switchyard/httpx" in table
    assert "upstream=aiohttp loadgen=aiohttp" in table
    (tmp_path / "out.json").write_text(json.dumps(report))  # the report is JSON-serialisable
