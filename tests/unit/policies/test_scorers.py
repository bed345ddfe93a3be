"""Built-in scorers: least-outstanding, kv-headroom, cheapest, slo-predicted, fastest-predicted,
prefix-affinity."""

from __future__ import annotations

import json
import textwrap
from collections import Counter

import pytest

from backends.models import Backend, BackendConfig, EngineLoad, PoolConfig, build_backends
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse
from policies.config import Route, Slo, parse_policy
from policies.engine import PolicyEngine
from policies.explain import explain
from policies.framework import RouteContext
from policies.profile import RequestProfile
from policies.scorers.affinity import PrefixAffinity, PrefixAffinityParams
from policies.scorers.cost import Cheapest, cost_per_mtok
from policies.scorers.latency import FastestPredicted, SloPredicted
from policies.scorers.load import (
    ClassOutstanding,
    ClassTokens,
    KvHeadroom,
    LeastOutstanding,
    PromptTokens,
)

MODEL = "m"


def _fleet(h100: int = 1, mi300x: int = 1) -> list[Backend]:
    pools = []
    for name, vendor, count, price, port in (
        ("h100", "nvidia", h100, 2.9, 9000),
        ("mi300x", "amd", mi300x, 1.75, 9100),
    ):
        if count:
            pools.append(
                PoolConfig(
                    name=name,
                    vendor=vendor,
                    accelerator=name,
                    price_per_gpu_hour=price,
                    backends=[
                        BackendConfig(url=f"http://127.0.0.1:{port + i}", models=[MODEL], max_model_len=32768)
                        for i in range(count)
                    ],
                )
            )
    return build_backends(pools)


def _ctx(route: Route | None = None, profile: RequestProfile | None = None, **kw) -> RouteContext:
    profile = profile or RequestProfile(model=MODEL, prompt_tokens_estimate=10, context_needed=11)
    return RouteContext(profile, "default", route or Route(), {}, **kw)


# --- least-outstanding --------------------------------------------------------------------------------


def test_least_outstanding_uses_the_larger_of_inflight_and_engine_queue():
    a, b, c = _fleet(h100=3, mi300x=0)
    a.inflight, a.load = 4, EngineLoad(running=1, waiting=0)  # 4: ours
    b.inflight, b.load = 1, EngineLoad(running=5, waiting=3)  # 8: the engine's, incl. other replicas
    c.inflight, c.load = 0, EngineLoad()  # 0
    scores = LeastOutstanding().score(_ctx(), [a, b, c])
    assert scores == pytest.approx([1 / 5, 1 / 9, 1.0])


def test_least_outstanding_relative_to_the_least_busy():
    a, b = _fleet(h100=2, mi300x=0)
    a.inflight, b.inflight = 2, 5
    assert LeastOutstanding().score(_ctx(), [a, b]) == pytest.approx([1.0, 3 / 6])


def test_class_outstanding_counts_only_the_requests_own_class():
    a, b = _fleet(h100=1, mi300x=1)
    a.inflight, a.inflight_by_class = 9, {"batch": 7, "long-context": 2}
    b.inflight, b.inflight_by_class = 5, {"long-context": 5}
    ctx = _ctx()
    ctx.request_class = "long-context"
    assert ClassOutstanding().score(ctx, [a, b]) == pytest.approx([1.0, 3 / 6])
    ctx.request_class = "chat"  # none in flight anywhere: a tie
    assert ClassOutstanding().score(ctx, [a, b]) == [1.0, 1.0]


def test_class_tokens_weighs_the_classs_own_requests_by_their_prompts():
    a, b = _fleet(h100=1, mi300x=1)
    # a: 4 long prompts of 10k and 7 batch jobs; b: 3 long prompts of 18k. By requests b has fewer.
    a.inflight_by_class, a.prompt_tokens_by_class = {"long-context": 4, "batch": 7}, {"long-context": 40_000}
    b.inflight_by_class, b.prompt_tokens_by_class = {"long-context": 3}, {"long-context": 54_000}
    ctx = _ctx()
    ctx.request_class = "long-context"
    assert ClassTokens().score(ctx, [a, b]) == pytest.approx([1.0, 41 / 55])  # in thousands of tokens
    assert ClassOutstanding().score(ctx, [a, b])[1] == 1.0
    ctx.request_class = "chat"  # none in flight anywhere: a tie
    assert ClassTokens().score(ctx, [a, b]) == [1.0, 1.0]


def test_prompt_tokens_counts_every_classs_prompts_in_flight():
    """A short request scores the backend busy with long prompts low, though it runs fewer requests."""
    a, b = _fleet(h100=1, mi300x=1)
    a.inflight, a.prompt_tokens_by_class = 12, {"interactive": 12 * 600}  # 7.2k tokens in twelve chats
    b.inflight, b.prompt_tokens_by_class = 3, {"long-context": 45_000, "interactive": 600}
    ctx = _ctx()
    ctx.request_class = "interactive"
    assert PromptTokens().score(ctx, [a, b]) == pytest.approx([1.0, 8.2 / 46.6])
    assert LeastOutstanding().score(ctx, [a, b])[0] < 1.0  # by requests, a is the busier
    b.prompt_tokens_by_class = {}
    a.prompt_tokens_by_class = {}
    assert PromptTokens().score(ctx, [a, b]) == [1.0, 1.0]  # nothing in flight: a tie


def test_a_route_weighing_prompt_tokens_sends_a_short_request_past_a_backend_busy_with_long_prompts():
    policy = textwrap.dedent(
        """
        routes:
          default:
            strategy: {least-outstanding: 1, prompt-tokens: 1}
        """
    )
    a, b = _fleet(h100=1, mi300x=1)
    a.inflight, a.prompt_tokens_by_class = 2, {"long-context": 30_000}
    b.inflight, b.prompt_tokens_by_class = 4, {"default": 2_400}
    engine = PolicyEngine(parse_policy(policy), [a, b])
    profile = RequestProfile(model=MODEL, prompt_tokens_estimate=500, context_needed=800)
    assert engine.choose(profile, [a, b]).candidates[0] is b  # fewer requests on a, far fewer tokens on b
    by_requests = PolicyEngine(parse_policy(policy.replace(", prompt-tokens: 1", "")), [a, b])
    assert by_requests.choose(profile, [a, b]).candidates[0] is a


# --- kv-headroom --------------------------------------------------------------------------------------


def test_kv_headroom_is_absolute_room():
    h100, mi300x = _fleet()
    h100.load = EngineLoad(kv_cache_usage=0.2)  # 0.8 x 80 GB = 64 GB free
    mi300x.load = EngineLoad(kv_cache_usage=0.5)  # 0.5 x 192 GB = 96 GB free
    scores = KvHeadroom().score(_ctx(), [h100, mi300x])
    assert scores == pytest.approx([64 / 96, 1.0])
    assert scores[1] > scores[0]


def test_kv_headroom_full_everywhere_and_over_full():
    h100, mi300x = _fleet()
    h100.load = EngineLoad(kv_cache_usage=1.0)
    mi300x.load = EngineLoad(kv_cache_usage=1.2)
    assert KvHeadroom().score(_ctx(), [h100, mi300x]) == [0.0, 0.0]


# --- cheapest -----------------------------------------------------------------------------------------


def test_cheapest_uses_the_price_floor_before_measurements():
    h100, mi300x = _fleet()
    assert cost_per_mtok(h100) == pytest.approx(2.9 / (17_700 * 3600) * 1e6)
    assert cost_per_mtok(mi300x) == pytest.approx(1.75 / (17_600 * 3600) * 1e6)
    scores = Cheapest().score(_ctx(), [h100, mi300x])
    assert scores[1] == 1.0
    assert scores[0] == pytest.approx(cost_per_mtok(mi300x) / cost_per_mtok(h100))


def test_measured_cost_wins_over_the_floor():
    h100, mi300x = _fleet()
    h100.measured_cost_per_mtok = 0.02  # below MI300X's floor (~0.028)
    assert cost_per_mtok(h100) == 0.02
    scores = Cheapest().score(_ctx(), [h100, mi300x])
    assert scores[0] == 1.0
    assert scores[1] < 1.0
    h100.measured_cost_per_mtok = 0.0  # no useful measurement: back to the floor
    assert cost_per_mtok(h100) == h100.pool.cost_floor_per_mtok


def test_cheapest_one_and_twice_the_cost_half():
    a, b, c = _fleet(h100=3, mi300x=0)
    a.measured_cost_per_mtok, b.measured_cost_per_mtok, c.measured_cost_per_mtok = 0.04, 0.02, 0.08
    assert Cheapest().score(_ctx(), [a, b, c]) == pytest.approx([0.5, 1.0, 0.25])


# --- slo-predicted ------------------------------------------------------------------------------------


def test_slo_predicted_with_an_slo():
    a, b, c = _fleet(h100=3, mi300x=0)
    route = Route(slo=Slo(ttft_ms=100, tpot_ms=20))
    ctx = _ctx(route, predicted_ttft=[0.05, 0.2, 0.2], predicted_tpot=[0.01, 0.01, 0.04])
    # meets it: 1; twice the TTFT target: 0.5; twice both: 0.25
    assert SloPredicted().score(ctx, [a, b, c]) == pytest.approx([1.0, 0.5, 0.25])


def test_slo_predicted_without_an_slo_fastest_end_to_end_wins():
    a, b = _fleet(h100=2, mi300x=0)
    profile = RequestProfile(model=MODEL, prompt_tokens_estimate=10, context_needed=110, max_tokens=100)
    ctx = _ctx(profile=profile, predicted_ttft=[0.1, 0.1], predicted_tpot=[0.01, 0.03])
    # 0.1 + 100 x 0.01 = 1.1 s vs 0.1 + 100 x 0.03 = 3.1 s
    assert SloPredicted().score(ctx, [a, b]) == pytest.approx([1.0, 1.1 / 3.1])


def test_slo_predicted_through_the_engine_reads_observed_latency_and_queue():
    h100, mi300x = _fleet()
    h100.observed.ttft, h100.observed.tpot = 0.1, 0.01
    mi300x.observed.ttft, mi300x.observed.tpot = 0.1, 0.01
    mi300x.load = EngineLoad(waiting=2)  # predicted TTFT 0.1 x (1 + 2/2) = 0.2 s
    engine = PolicyEngine(
        parse_policy(
            textwrap.dedent(
                """
                routes:
                  default:
                    slo: {ttft_ms: 100}
                    saturation: {max_waiting: 8}
                    strategy: {slo-predicted: 1}
                """
            )
        ),
        [h100, mi300x],
    )
    e = explain(
        engine, RequestProfile(model=MODEL, prompt_tokens_estimate=10, context_needed=11), [h100, mi300x]
    )
    assert e.explanation is not None
    scores = {c.backend: c.scores["slo-predicted"] for c in e.explanation.candidates}
    assert scores == pytest.approx(
        {"h100-0": 1.0, "mi300x-0": 0.5}, abs=0.01
    )  # + 10 prompt tokens of prefill
    assert e.order[0] == h100.name


def test_fastest_predicted_breaks_the_tie_among_backends_that_all_meet_the_slo():
    h100, mi300x = _fleet(h100=1, mi300x=1)
    route = Route(slo=Slo(ttft_ms=800, tpot_ms=60))
    profile = RequestProfile(model=MODEL, prompt_tokens_estimate=10, context_needed=110, max_tokens=100)
    # both meet the SLO: slo-predicted cannot tell them apart; 0.05 + 100 x 0.008 = 0.85 s beats
    # 0.07 + 100 x 0.011 = 1.17 s
    ctx = _ctx(route, profile=profile, predicted_ttft=[0.05, 0.07], predicted_tpot=[0.008, 0.011])
    assert SloPredicted().score(ctx, [h100, mi300x]) == pytest.approx([1.0, 1.0])
    assert FastestPredicted().score(ctx, [h100, mi300x]) == pytest.approx([1.0, 0.85 / 1.17])


def test_fastest_predicted_without_predictions_scores_every_backend_alike():
    a, b = _fleet(h100=2, mi300x=0)
    assert FastestPredicted().score(_ctx(), [a, b]) == [1.0, 1.0]


def test_fastest_predicted_through_the_engine_sends_an_idle_fleet_s_request_to_the_faster_pool():
    """`prefer: any` lists the pools in file order; the MI300X listed first still loses to an idle
    H100 on its priors (lower time per token at small batches)."""
    h100, mi300x = _fleet()
    engine = PolicyEngine(
        parse_policy(
            textwrap.dedent(
                """
                routes:
                  default:
                    prefer: any
                    slo: {ttft_ms: 800, tpot_ms: 60}
                    strategy: {slo-predicted: 2, least-outstanding: 1, fastest-predicted: 1}
                """
            )
        ),
        [mi300x, h100],
    )
    profile = RequestProfile(model=MODEL, prompt_tokens_estimate=200, context_needed=456, max_tokens=256)
    e = explain(engine, profile, [mi300x, h100])
    assert e.explanation is not None
    scores = {c.backend: c.scores["fastest-predicted"] for c in e.explanation.candidates}
    assert scores[h100.name] == 1.0 and scores[mi300x.name] < 1.0
    assert e.order[0] == h100.name


# --- prefix-affinity ----------------------------------------------------------------------------------


def _session_profile(session: str | None, prompt: str = "hello") -> RequestProfile:
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}]}
    caller = Caller(request_id="r", authorization=None, forwarded={}, session=session)
    return classify(parse("chat", json.dumps(body).encode()), caller)


def _winner(scorer: PrefixAffinity, profile: RequestProfile, backends: list[Backend]) -> str:
    scores = scorer.score(_ctx(profile=profile), backends)
    assert sorted(scores) == [0.0] * (len(backends) - 1) + [1.0]
    return backends[scores.index(1.0)].name


def test_prefix_affinity_same_session_same_backend():
    backends = _fleet(h100=4, mi300x=4)
    scorer = PrefixAffinity()
    first = _winner(scorer, _session_profile("sess-42"), backends)
    for _ in range(5):
        assert _winner(scorer, _session_profile("sess-42", prompt="another turn"), backends) == first
    # a fresh scorer (another engine, another gateway replica) makes the same choice
    assert _winner(PrefixAffinity(), _session_profile("sess-42"), list(reversed(backends))) == first


def test_prefix_affinity_is_stable_across_engine_instances():
    policy = textwrap.dedent(
        """
        routes:
          default:
            strategy: {prefix-affinity: 1}
        """
    )
    backends = _fleet(h100=4, mi300x=4)
    sessions = [f"user-{i}" for i in range(20)]
    one = PolicyEngine(parse_policy(policy), backends)
    backends_two = _fleet(h100=4, mi300x=4)  # distinct Backend objects with the same names
    two = PolicyEngine(parse_policy(policy), backends_two)
    first = [one.choose(_session_profile(s), backends).candidates[0].name for s in sessions]
    again = [one.choose(_session_profile(s), backends).candidates[0].name for s in sessions]
    other = [two.choose(_session_profile(s), backends_two).candidates[0].name for s in sessions]
    assert first == again == other


def test_prefix_affinity_spreads_sessions():
    backends = _fleet(h100=4, mi300x=4)
    scorer = PrefixAffinity()
    counts = Counter(_winner(scorer, _session_profile(f"s{i}"), backends) for i in range(400))
    assert len(counts) == 8
    assert max(counts.values()) < 100  # 50 each on average


def test_prefix_affinity_removing_a_backend_moves_only_its_keys():
    backends = _fleet(h100=4, mi300x=4)
    scorer = PrefixAffinity()
    keys = [f"s{i}" for i in range(300)]
    before = {k: _winner(scorer, _session_profile(k), backends) for k in keys}
    gone = backends[3].name
    remaining = [b for b in backends if b.name != gone]
    after = {k: _winner(scorer, _session_profile(k), remaining) for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == gone}
    assert moved  # some keys were on it


def test_prefix_affinity_without_session_uses_the_prompt_prefix():
    backends = _fleet(h100=4, mi300x=4)
    scorer = PrefixAffinity(PrefixAffinityParams(prefix_chars=20))
    shared = "You are a helpful assistant. "
    winners = {_winner(scorer, _session_profile(None, shared + f"question {i}"), backends) for i in range(10)}
    assert len(winners) == 1
    empty = RequestProfile(model=MODEL, prompt_tokens_estimate=1, context_needed=2)
    assert scorer.score(_ctx(profile=empty), backends) == [0.0] * 8
