"""The replay on its own: an access log in, the policy engine and the simulator on a virtual clock, outcomes
out; and what it says it cannot model."""

from __future__ import annotations

import json
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from backends.sim.fleet_spec import DEMO_FLEET, load_fleet_spec
from gateway.telemetry.logs import replay_keys
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import LogError, read_log
from loadtest.whatif.cli import parse_slo
from loadtest.whatif.compare import whatif
from loadtest.whatif.standins import Profiles


def _line(t: float, **extra: object) -> dict[str, object]:
    line: dict[str, object] = {
        "ts": 1000.0 + t + 1.0,
        "duration_s": 1.0,
        "request_id": f"r{t}",
        "endpoint": "/v1/chat/completions",
        "status": 200,
        "model": "llama-3.1-8b",
        "stream": True,
        "backend": "h100-0",
        "class": "interactive",
        "prompt_tokens": 300,
        "completion_tokens": 50,
        "prompt_estimate": 300,
        "max_tokens": 50,
    }
    line.update(extra)
    return line


def _write(path: Path, lines: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_prompt_hashes_share_a_prefix_and_never_carry_text() -> None:
    doc = "shared document " * 200
    a = SimpleNamespace(session=None, affinity="", prefix=None)
    b = SimpleNamespace(session=None, affinity="", prefix=None)
    replay_keys(a, SimpleNamespace(prompt_prefix=lambda n: (doc + "question one " * 200)[:n]))  # type: ignore[arg-type]
    replay_keys(b, SimpleNamespace(prompt_prefix=lambda n: (doc + "another one " * 200)[:n]))  # type: ignore[arg-type]
    assert a.affinity == b.affinity == f"{zlib.crc32(doc[:512].encode()):08x}"
    assert a.prefix[:3] == b.prefix[:3] and a.prefix[-1] != b.prefix[-1]
    assert "shared" not in json.dumps([a.prefix, a.affinity])


def test_replay_serves_every_request_and_names_what_it_cannot_model(tmp_path: Path) -> None:
    lines = [_line(i * 0.5, priority="high" if i % 2 else None) for i in range(40)]
    lines.append(_line(30, model="gpt-unknown"))
    lines.append(_line(31, endpoint="/v1/embeddings"))
    lines.append(_line(32, prompt_tokens=40000, prompt_estimate=40000))
    lines.append({"ts": 1040.0, "request_id": "x", "endpoint": "/v1/chat/completions", "status": 400})
    log = _write(tmp_path / "access.jsonl", lines)
    report = whatif(
        read_log(log),
        load_fleet_spec(DEMO_FLEET),
        ("balanced", policy_file("balanced")),
        ("cheapest", policy_file("cheapest")),
        tmp_path / "out",
    )
    for name in ("balanced", "cheapest"):
        overall = report["policies"][name]["overall"]
        assert overall["requests"] == 43 and overall["ok"] == 40
        assert overall["ttft_ms"]["p50"] > 0 and report["policies"][name]["cost"]["tokens"] > 0
    # balanced sends high-priority interactive traffic to H100; cheapest sends it to MI300X
    assert report["policies"]["balanced"]["split"]["vendor"].get("nvidia", 0) > 0
    assert report["policies"]["cheapest"]["split"]["vendor"].get("amd", 0) > 20
    limits = " ".join(report["whatif"]["limits"])
    assert "gpt-unknown" in limits and "embeddings" in limits and "longer than" in limits
    assert "1 lines the gateway answered itself" in limits
    assert "difference" in report["whatif"] and "ALL" in report["whatif"]["difference"]
    assert (tmp_path / "out" / "report.html").read_text().count("<svg") >= 3


def test_an_unreadable_log_and_a_bad_slo_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(LogError, match="no request a backend served"):
        read_log(_write(tmp_path / "empty.jsonl", [{"ts": 1.0, "status": 400}]))
    with pytest.raises(LogError, match="cannot read"):
        read_log(tmp_path / "missing.jsonl")
    assert parse_slo("chat:ttft_ms=500,tpot_ms=40")[1].tpot_ms == 40
    with pytest.raises(ValueError, match="unknown bound"):
        parse_slo("chat:latency=5")


def test_scale_compresses_time(tmp_path: Path) -> None:
    log = _write(tmp_path / "a.jsonl", [_line(0), _line(3)])
    assert [r.at_s for r in read_log(log, scale=1.5).requests] == [0.0, 2.0]


def test_the_html_report_shows_the_difference_and_the_limits(tmp_path: Path) -> None:
    lines = [_line(i * 0.5) for i in range(20)] + [_line(30, model="gpt-unknown")]
    log = _write(tmp_path / "access.jsonl", lines)
    fleet = load_fleet_spec(DEMO_FLEET)
    baseline, candidate = ("balanced", policy_file("balanced")), ("cheapest", policy_file("cheapest"))
    whatif(read_log(log), fleet, baseline, candidate, tmp_path / "out")
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Difference: cheapest minus balanced" in html and " pt</td>" in html
    assert "gpt-unknown" in html


def test_whatif_takes_the_fleet_from_a_gateway_config(tmp_path: Path) -> None:
    from gateway.cli.main import main

    config = tmp_path / "gateway.yaml"
    config.write_text(
        "pools:\n"
        "  - {name: fast, vendor: nvidia, accelerator: h100, price_per_gpu_hour: 2.9, backends: [\n"
        "     {name: f0, url: 'http://127.0.0.1:9', models: [llama-3.1-8b], max_model_len: 8192}]}\n"
        "  - {name: big, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1.75, backends: [\n"
        "     {name: b0, url: 'http://127.0.0.1:9', models: [llama-3.1-8b], max_model_len: 8192},\n"
        "     {name: b1, url: 'http://127.0.0.1:9', models: [llama-3.1-8b], max_model_len: 8192}]}\n"
    )
    log = _write(tmp_path / "access.jsonl", [_line(i * 0.5) for i in range(20)])
    out = tmp_path / "out"
    assert (
        main(
            ["whatif", "--log", str(log), "--config", str(config), "--policy", "cheapest", "--out", str(out)]
        )
        == 0
    )
    report = json.loads((out / "report.json").read_text())
    assert [(g["pool"], g["count"]) for g in report["scenario"]["fleet"]] == [("fast", 1), ("big", 2)]
    assert report["policies"]["cheapest"]["split"]["vendor"] == {"amd": 20}


def _replay_outcomes(log: Path, fleet_file: Path, scrape_interval_s: float) -> dict[str, tuple[float, float]]:
    from loadtest.whatif.replay import Replay
    from loadtest.whatif.simfleet import build_fleet
    from policies.config import load_policy
    from policies.engine import PolicyEngine

    trace = read_log(log)
    fleet = build_fleet(load_fleet_spec(fleet_file))
    engine = PolicyEngine(load_policy(policy_file("balanced")), [s.backend for s in fleet])
    result = Replay(fleet, engine, trace.requests, scrape_interval_s).run()
    ids = {r.index: r.line.request_id for r in trace.requests}
    return {ids[o.index]: (o.ttft or 0.0, o.e2e or 0.0) for o in result.outcomes}


def test_a_request_arriving_while_decode_steps_are_coasted_joins_the_next_step(tmp_path: Path) -> None:
    """The replay applies runs of decode-only steps at once until the next arrival (coasting); a request
    arriving inside the last of them starts at that step's end, as without coasting, not a step later."""
    fleet_file = tmp_path / "fleet.yaml"
    fleet_file.write_text(
        "model: llama-3.1-8b\ngroups:\n  - {pool: h100, vendor: nvidia, accelerator: h100, count: 1,"
        " price_per_gpu_hour: 2.9, profile: {gpu: h100-sxm5}}\n"
    )
    long = _line(0.0, completion_tokens=800, max_tokens=800)
    arrivals = [
        _line(0.0 + 0.37 * k + 0.0011 * k * k, completion_tokens=20, max_tokens=20) for k in range(1, 12)
    ]
    log = _write(tmp_path / "access.jsonl", [long, *arrivals])
    coasting = _replay_outcomes(
        log, fleet_file, scrape_interval_s=1000.0
    )  # nothing stops a coast but arrivals
    stepwise = _replay_outcomes(
        log, fleet_file, scrape_interval_s=0.001
    )  # a scrape before every step: no coast
    assert coasting.keys() == stepwise.keys() and len(coasting) == 12
    for request_id, (ttft, e2e) in stepwise.items():
        assert coasting[request_id][0] == pytest.approx(ttft, abs=1e-6), request_id
        assert coasting[request_id][1] == pytest.approx(e2e, abs=1e-6), request_id


def test_the_replay_estimates_prompts_as_the_gateway_does_learning_from_the_counts(tmp_path: Path) -> None:
    """A logged line's prompt is estimated from its characters by a sizer the earlier answers taught, per
    key; an older line without `prompt_chars` stands for 4 characters per estimated token."""
    taught = [_line(i, prompt_chars=50_000, prompt_tokens=10_000, prompt_estimate=12_500) for i in range(5)]
    later = _line(9, prompt_chars=40_000, prompt_tokens=8_000, prompt_estimate=10_000)
    other_key = _line(9, prompt_chars=40_000, prompt_tokens=8_000, key="key-other")
    old = _line(9, prompt_estimate=3_000, prompt_tokens=2_500, key="key-old")
    lines = read_log(_write(tmp_path / "log.jsonl", [*taught, later, other_key, old])).requests
    profiles = Profiles()
    assert profiles.of(lines[0].line).prompt_tokens_estimate == 12_500  # nothing counted yet
    for request in lines[:5]:
        profiles.counted(request.line)
    assert 8_100 < profiles.of(lines[5].line).prompt_tokens_estimate < 8_300  # 4.9 characters a token
    assert profiles.of(lines[6].line).prompt_tokens_estimate == 10_000  # another key: still 4
    assert profiles.of(lines[7].line).prompt_tokens_estimate == 3_000  # 12,000 characters, 4 a token
