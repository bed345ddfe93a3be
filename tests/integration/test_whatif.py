"""The virtual-clock replay agrees with the real thing: a scenario's traffic served over HTTP (simulated
fleet processes, the gateway with its access log on, streamed requests), then the access log the gateway
wrote replayed by `switchyard whatif`'s replay, give the same SLO attainment (within the run-to-run
noise of the HTTP side itself, which may sit up to 8 requests or 6.5% lower) and TTFT p50 (within 10%),
per class: under `balanced`, and under a policy that holds most RAG requests for room (back-pressure),
where the replay must hold as many. Run by `make test-whatif` (~3 minutes with the plan).

The replay is told what the load test does to time: the fleet runs `time_scale` times faster than real
time, so the log's real times are divided by it and the gateway's 0.25 s scrape is that many simulated
seconds; the gateway routes by latencies on the fleet's clock (the load test sets its
`policy.clock_scale`), so the replay's `clock_scale` is 1.

Both classes' SLOs bind under `balanced`: chat meets its SLO about 75% of the time, RAG (5,200-6,000
prompt tokens: long-context, a shedding route; those that fit go to the H100, the rest to the MI300X)
about 72%; an SLO every request meets or misses would compare nothing. Chat's time per token SLO sits
where few requests are near it: at 38 ms (its p50 is ~42 ms on the 70B H100) one millisecond moved 4.3
points of chat across it, and the HTTP side, on a real clock, differs from the replay by about that much
(7 requests of 153 in one CI run); at 50 ms one millisecond moves about 1.6 points (2.5 requests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from backends.sim.fleet_spec import load_fleet_spec
from gateway.cli.main import main
from loadtest.scenario import Slo, parse_scenario
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import replay_policy, whatif_scenario
from loadtest.whatif.plan import fleet_of
from loadtest.whatif.plan_cli import make_plan, mix_name
from loadtest.whatif.record import SCRAPE_INTERVAL_S, record, serve_config
from loadtest.whatif.simfleet import gateway_yaml
from loadtest.whatif.synth import write_log
from loadtest.workload import PlannedRequest, plan

pytestmark = pytest.mark.whatif


def _classes(
    rag_weight: int, chat_slo: tuple[int, int], rag_slo: tuple[int, int], rag_prompt: int = 4000
) -> str:
    """A scenario's `classes:` (chat and rag); the SLOs are (ttft_ms, tpot_ms). Rag's prompts are
    `rag_prompt` tokens +-400."""
    return f"""classes:
  - name: chat
    weight: 4
    prompt_tokens: {{mean: 600, spread: 0.5, min: 50, max: 1500}}
    output_tokens: {{mean: 60, spread: 0.4, min: 8, max: 150}}
    priority: {{value: high, fraction: 0.3}}
    slo: {{ttft_ms: {chat_slo[0]}, tpot_ms: {chat_slo[1]}}}
  - name: rag
    weight: {rag_weight}
    prompt_tokens: {{mean: {rag_prompt}, spread: 0.05, min: {rag_prompt - 400}, max: {rag_prompt + 400}}}
    output_tokens: {{mean: 60, spread: 0.3, min: 16, max: 120}}
    shared_prefix: {{documents: 2, tokens: 3500}}
    slo: {{ttft_ms: {rag_slo[0]}, tpot_ms: {rag_slo[1]}}}
"""


TIME_SCALE = 2
HTTP_PATH_MS = 5
"""Real milliseconds the HTTP path may add to a request's TTFT beyond what the replay models."""
# rag's TTFT SLO is 600 ms so that it separates requests: balanced sends the prompts that fit to the H100
# too (98.8% met within 1.5 s over HTTP, 70.7% within 600 ms, and the replay alike)
SCENARIO = f"""
name: agree
seed: 11
duration_s: 100
time_scale: {TIME_SCALE}
max_requests: 400
drain_s: 60
arrivals: {{process: poisson, rate: 2.5}}
fleet:
  model: llama-3.1-70b
  groups:
    - {{pool: h100, vendor: nvidia, accelerator: h100, count: 1, gpus_per_backend: 2, price_per_gpu_hour: 2.9,
       profile: {{gpu: h100-sxm5, model: llama-3.1-70b}}}}
    - {{pool: mi300x, vendor: amd, accelerator: mi300x, count: 1, price_per_gpu_hour: 1.75,
       max_model_len: 32768, profile: {{gpu: mi300x, model: llama-3.1-70b}}}}
{_classes(rag_weight=2, chat_slo=(400, 50), rag_slo=(600, 110), rag_prompt=5600)}"""


HELD_POLICY = """name: held
description: RAG on the MI300X, waiting for room (at most 3 requests in flight there); chat on the H100.
classes:
  - name: rag
    when: {prompt_tokens: {gt: 3000}}
routes:
  rag:
    prefer: {vendor: amd}
    shed: true
    saturation: {max_inflight: 3}
    backpressure: {max_queued: 64, max_wait_ms: 30000, retry_after_s: 1}
  default:
    prefer: {vendor: nvidia}
"""
"""RAG requests wait whenever the MI300X has three in flight (most of them, at this load) and go as one
ends; none waits long enough to be refused (30 s on the fleet's clock, which the gateway keeps)."""


def _agreement(
    tmp_path: Path, text: str, policy: str, binding: tuple[str, ...] = ("chat", "rag")
) -> tuple[dict[str, Any], int, int]:
    """Serve the scenario over HTTP under `policy`, replay the gateway's access log, compare per class;
    returns the summary and how many requests waited for room over HTTP and in the replay."""
    scenario = parse_scenario(text, tmp_path / "agree.yaml")
    requests = plan(scenario)
    http, log = record(scenario, policy, requests, tmp_path / "http")

    trace = read_log(log, scale=1 / TIME_SCALE)
    assert len(trace.requests) == len(requests) and trace.refused == 0
    # the log's class is the gateway's (the policy's routes); the load test reports by the scenario's class
    class_of = {r.headers["x-request-id"]: r.request_class for r in requests}
    for recorded in trace.requests:
        recorded.line.request_class = class_of[recorded.line.client_request_id or ""]
    slos = {c.name: c.slo for c in scenario.spec.classes}
    run = replay_policy(
        policy,
        policy_file(policy),
        whatif_scenario(trace, scenario.fleet, slos),
        trace,
        scrape_interval_s=SCRAPE_INTERVAL_S * TIME_SCALE,
    )
    replayed = run.report
    summary = {
        cls: {
            side: (
                report["classes"][cls]["requests"],
                report["classes"][cls]["slo_attainment"],
                report["classes"][cls]["ttft_ms"]["p50"],
            )
            for side, report in (("http", http), ("replay", replayed))
        }
        for cls in ("chat", "rag")
    }
    held_http = sum(1 for r in trace.requests if r.line.queued_s > 0)
    (tmp_path / "agreement.json").write_text(json.dumps(summary))
    print(json.dumps({**summary, "held": {"http": held_http, "replay": run.result.held}}))
    assert http["overall"]["errors"] == 0 and replayed["overall"]["errors"] == 0
    for cls, both in summary.items():
        (count, http_met, http_ttft), (_, replay_met, replay_ttft) = both["http"], both["replay"]
        if cls in binding:
            assert 0.1 < http_met < 0.9, (cls, summary)  # the SLO separates requests: a comparison
        # within the real system's own noise, and the HTTP side may sit lower. Since prompt sizes are
        # learned, the same requests served over HTTP met 100-109 of chat's 153 in seven runs on
        # 2026-11-26 (one a CI run after the whole suite, one beside a busy core, one at time scale 1)
        # and the replay of each run's log 106-109, never fewer than HTTP; RAG 61-67 of 82 against
        # 64-66. What the HTTP path adds (the gateway, the sims' own CPU on two cores shared with the
        # client) slows some requests past an SLO, and the gateway's measured latencies, which feed its
        # predictions, include it: ~1 in 10 chat requests went elsewhere than in the replay, and fewer of
        # those met the SLO. The slower the core, the more the HTTP path adds: on 2026-11-29, on an Intel
        # Xeon where the gateway costs twice the CPU per request it costs on those machines, HTTP met 1, 7
        # and 10 fewer than the replay in three runs (the 10, 100 of 153, a CI run after the whole suite).
        # So HTTP may meet up to 8 requests or 8% of the class fewer (whichever is more), and at most 6
        # or 4% more. A modelling error (a cache, a queue or a speed the replay lacks) moves tens of points
        fewer = round(replay_met * count) - round(http_met * count)
        assert -max(6, 0.04 * count) <= fewer <= max(8, 0.08 * count), (cls, summary)
        # within 10%, plus what the HTTP path adds to every request and the replay does not model (the
        # gateway, SSE framing, the load generator's client: a few ms of real time, TIME_SCALE times that
        # on the fleet's clock). Two clean-clone CI runs on 2026-11-26 measured chat's HTTP p50 at 158.6
        # and 159.8 ms against the replay's 150.1 and 141.7 (12.8% apart), on a machine that had just run
        # the whole suite; five runs on their own, 146-158 against 146-150
        slack = 0.10 * http_ttft + HTTP_PATH_MS * TIME_SCALE
        assert abs(replay_ttft - http_ttft) <= slack, (cls, summary)
    return summary, held_http, run.result.held


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_replay_of_the_gateways_access_log_agrees_with_the_http_load_test(tmp_path: Path) -> None:
    _agreement(tmp_path, SCENARIO, "balanced")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_replay_holds_requests_for_room_as_the_gateway_does(tmp_path: Path) -> None:
    """Most RAG requests wait for room over HTTP (the access log's `queued_s` says which and how long);
    the replay holds them as the gateway does, and the classes agree as above (RAG's SLO binds: its
    TTFT is mostly the wait; chat has the H100 to itself and meets its SLO ~87% of the time)."""
    policy = tmp_path / "held.yaml"
    policy.write_text(HELD_POLICY)
    text = SCENARIO.replace("duration_s: 100", "duration_s: 80").replace("rate: 2.5}", "rate: 1.5}")
    text = text.replace("{ttft_ms: 600, tpot_ms: 110}", "{ttft_ms: 1500, tpot_ms: 110}")  # RAG's wait binds
    assert "ttft_ms: 1500" in text
    _, held_http, held_replay = _agreement(tmp_path, text, str(policy), binding=("rag",))
    assert held_http >= 10 and abs(held_replay - held_http) <= max(3, 0.2 * held_http)


PLAN_TIME_SCALE = 2
PLAN_TARGET = 0.75
PLAN_SCENARIO = """
name: plan-e2e
seed: 5
duration_s: 60
time_scale: {time_scale}
max_requests: 360
drain_s: 60
arrivals: {{process: poisson, rate: 6}}
fleet: {fleet}
""" + _classes(rag_weight=1, chat_slo=(1000, 90), rag_slo=(3000, 110)).replace("{", "{{").replace("}", "}}")
ANY_FLEET = (
    "{model: llama-3.1-70b, groups: [{pool: x, vendor: amd, accelerator: mi300x, price_per_gpu_hour: 1,"
    " profile: {gpu: mi300x}}]}"
)
PLAN_ARGS = [
    "--slo", "chat:ttft_ms=1000,tpot_ms=90", "--slo", "rag:ttft_ms=3000,tpot_ms=110",
    "--target", str(PLAN_TARGET), "--gpu", "h100=2.90", "--gpu", "mi300x=1.75",
    "--scrape-interval", str(SCRAPE_INTERVAL_S * PLAN_TIME_SCALE),
]  # fmt: skip


def _load_test(folder: Path, requests: list[PlannedRequest]) -> dict[str, Any]:
    """The HTTP load test of `requests` on folder/fleet.yaml behind folder/gateway.yaml's gateway."""
    text = PLAN_SCENARIO.format(time_scale=PLAN_TIME_SCALE, fleet="{file: fleet.yaml}")
    scenario = parse_scenario(text, folder / "scenario.yaml")
    written = yaml.safe_load((folder / "gateway.yaml").read_text())
    return serve_config(scenario, written, requests, folder / "http")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_planned_fleet_meets_the_slos_over_http_and_the_next_cheaper_mix_does_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = PLAN_SCENARIO.format(time_scale=PLAN_TIME_SCALE, fleet=ANY_FLEET)
    requests = plan(parse_scenario(text, tmp_path / "s.yaml"))
    log = write_log(requests, tmp_path / "access.jsonl")  # the arrivals the load tests send again
    out = tmp_path / "recommended"
    assert main(["plan", "--log", str(log), "--out", str(out), *PLAN_ARGS]) == 0
    printed = capsys.readouterr().out

    # the same search, to read its frontier: the next cheaper mix, under the recommended policy
    slos = {"chat": Slo(ttft_ms=1000, tpot_ms=90), "rag": Slo(ttft_ms=3000, tpot_ms=110)}
    gpus = [("h100", 2.90), ("mi300x", 1.75)]
    result = make_plan(log, gpus, 1.0, None, slos, PLAN_TARGET, None, SCRAPE_INTERVAL_S * PLAN_TIME_SCALE)
    assert result.best is not None and result.best.policy is not None
    written = load_fleet_spec(out / "fleet.yaml")
    assert [g.count for g in written.groups] == [c for c in result.best.counts if c]
    frontier = result.frontier
    cheaper = frontier[frontier.index(result.best) - 1]
    cheaper_dir = tmp_path / "cheaper"
    cheaper_dir.mkdir()
    cheaper_fleet = fleet_of(result.types, cheaper.counts, result.model)
    (cheaper_dir / "fleet.yaml").write_text(yaml.safe_dump(msgspec.to_builtins(cheaper_fleet)))
    policy = yaml.safe_load((out / "gateway.yaml").read_text())["policy"]["file"]
    (cheaper_dir / "gateway.yaml").write_text(gateway_yaml(cheaper_fleet, policy))

    served = {"recommended": _load_test(out, requests), "cheaper": _load_test(cheaper_dir, requests)}
    met = {
        side: {cls: report["classes"][cls]["slo_attainment"] for cls in slos}
        for side, report in served.items()
    }
    summary = {
        "recommended": (mix_name(result, result.best.counts), result.best.worst),
        "cheaper": (mix_name(result, cheaper.counts), cheaper.worst),
        "http": met,
    }
    (tmp_path / "plan-e2e.json").write_text(json.dumps(summary))
    print(printed, json.dumps(summary))
    assert served["recommended"]["overall"]["errors"] == 0, summary
    assert all(attained >= PLAN_TARGET for attained in met["recommended"].values()), summary
    assert min(met["cheaper"].values()) < PLAN_TARGET, summary
