"""PolicyEngine: classification, tiers, saturation, SLO demotion, empty results, explanations, plugins."""

from __future__ import annotations

import json
import sys
import textwrap
from collections import Counter

import msgspec
import pytest

from backends.models import Backend, BackendConfig, EngineLoad, PoolConfig, build_backends
from backends.yamlfile import ConfigError
from gateway.request.classify import Caller, classify, key_id
from gateway.request.parse import parse
from policies import registry
from policies.config import parse_policy
from policies.engine import PolicyEngine
from policies.explain import Explanation, explain
from policies.least_inflight import LeastInflight
from policies.profile import RequestProfile, context_needed

MODEL = "m"


def _fleet(max_model_len: int = 32768) -> list[Backend]:
    """h100-0, h100-1 (nvidia); mi300x-0, mi300x-1 (amd); spare-0 (an mi325x pool no test route names)."""
    pools = []
    for name, vendor, accel, count, port in (
        ("h100", "nvidia", "h100", 2, 9000),
        ("mi300x", "amd", "mi300x", 2, 9100),
        ("spare", "amd", "mi325x", 1, 9200),
    ):
        pools.append(
            PoolConfig(
                name=name,
                vendor=vendor,
                accelerator=accel,
                price_per_gpu_hour=2.0,
                backends=[
                    BackendConfig(
                        url=f"http://127.0.0.1:{port + i}", models=[MODEL], max_model_len=max_model_len
                    )
                    for i in range(count)
                ],
            )
        )
    return build_backends(pools)


def _by_name(backends: list[Backend]) -> dict[str, Backend]:
    return {b.name: b for b in backends}


def _engine(text: str, backends: list[Backend]) -> PolicyEngine:
    return PolicyEngine(parse_policy(textwrap.dedent(text), "<test>"), backends)


def _profile(**kw) -> RequestProfile:
    kw.setdefault("model", MODEL)
    kw.setdefault("prompt_tokens_estimate", 100)
    kw.setdefault("context_needed", context_needed(kw["prompt_tokens_estimate"], kw.get("max_tokens")))
    return RequestProfile(**kw)


def _request(body: dict, headers: dict[str, str] | None = None) -> RequestProfile:
    """A profile the way the gateway builds one: parsed body plus the caller's headers."""
    raw = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    caller = Caller(request_id="r", authorization=None, forwarded={}, headers=raw)
    for name, value in (headers or {}).items():
        name = name.lower()
        if name == "authorization":
            caller.authorization = value
        elif name == "x-switchyard-priority":
            caller.priority = value
        elif name == "x-switchyard-class":
            caller.explicit_class = value
        elif name == "x-switchyard-tenant":
            caller.tenant = value
        elif name == "x-session-id":
            caller.session = value
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * 10}], **body}
    return classify(parse("chat", json.dumps(body).encode()), caller)


def _names(backends: list[Backend]) -> list[str]:
    return [b.name for b in backends]


# --- classification -----------------------------------------------------------------------------------

CLASSES = """
classes:
  - name: vip
    when:
      any:
        - priority: high
        - key: KEY
        - tenant: [acme, globex]
  - name: streaming
    when: {stream: true}
  - name: streaming-small
    when: {stream: true, max_tokens: {lte: 100}}
  - name: fanout
    when: {n: {gte: 2}}
  - name: huge
    when: {prompt_tokens: {gt: 1000}}
  - name: tiny
    when: {prompt_tokens: {lt: 3}}
  - name: exact
    when: {max_tokens: {eq: 77}}
  - name: band
    when: {max_tokens: {gte: 200, lte: 300}}
  - name: models
    when: {model: [other-a, other-b]}
  - name: team
    when: {headers: {X-Team: search}}
  - name: batch
    when: {priority: batch}
routes:
  vip: {}
  streaming: {}
  streaming-small: {}
  fanout: {}
  huge: {}
  tiny: {}
  exact: {}
  band: {}
  models: {}
  team: {}
  batch: {}
  default: {}
""".replace("KEY", key_id("Bearer sk-vip"))


@pytest.fixture
def classes_engine() -> PolicyEngine:
    return _engine(CLASSES, _fleet())


@pytest.mark.parametrize(
    ("body", "headers", "expected"),
    [
        ({"stream": True, "max_tokens": 50}, {}, ("streaming", "rule 2")),  # first match wins over rule 3
        ({"n": 2}, {}, ("fanout", "rule 4")),
        ({"n": 1}, {}, ("default", "default")),
        ({"messages": [{"role": "user", "content": "x" * 4004}]}, {}, ("huge", "rule 5")),  # 1001 tokens
        ({"messages": [{"role": "user", "content": "x" * 4000}]}, {}, ("default", "default")),  # 1000: not gt
        ({"messages": [{"role": "user", "content": "x" * 8}]}, {}, ("tiny", "rule 6")),  # 2 tokens
        ({"messages": [{"role": "user", "content": "x" * 12}]}, {}, ("default", "default")),  # 3: not lt
        ({"max_tokens": 77}, {}, ("exact", "rule 7")),
        ({"max_tokens": 78}, {}, ("default", "default")),
        ({"max_tokens": 200}, {}, ("band", "rule 8")),
        ({"max_tokens": 300}, {}, ("band", "rule 8")),
        ({"max_tokens": 301}, {}, ("default", "default")),
        ({"model": "other-b"}, {}, ("models", "rule 9")),
        ({"model": "other-c"}, {}, ("default", "default")),
        ({}, {"x-switchyard-priority": "high"}, ("vip", "rule 1")),
        ({"metadata": {"priority": "high"}}, {}, ("vip", "rule 1")),
        ({"metadata": {"priority": "batch"}}, {}, ("batch", "rule 11")),
        ({"metadata": {"priority": "high"}}, {"x-switchyard-priority": "batch"}, ("batch", "rule 11")),
        ({}, {"authorization": "Bearer sk-vip"}, ("vip", "rule 1")),
        ({}, {"authorization": "Bearer sk-other"}, ("default", "default")),
        ({}, {"x-switchyard-tenant": "globex"}, ("vip", "rule 1")),
        ({}, {"x-switchyard-tenant": "initech"}, ("default", "default")),
        ({}, {"x-team": "search"}, ("team", "rule 10")),
        ({}, {"x-team": "ads"}, ("default", "default")),
        ({"n": 3}, {"x-switchyard-class": "huge"}, ("huge", "header")),
        ({"n": 3}, {"x-switchyard-class": "no-such-class"}, ("fanout", "rule 4")),
        ({}, {"x-switchyard-class": "no-such-class"}, ("default", "default")),
    ],
)
def test_classify(classes_engine, body, headers, expected):
    assert classes_engine.classify(_request(body, headers)) == expected


def test_stream_false_condition_and_missing_max_tokens():
    engine = _engine(
        """
        classes:
          - name: plain
            when: {stream: false, max_tokens: {lt: 10}}
          - name: nonstream
            when: {stream: false}
        routes: {plain: {}, nonstream: {}, default: {}}
        """,
        _fleet(),
    )
    assert engine.classify(_profile(stream=False, max_tokens=5)) == ("plain", "rule 1")
    # no max_tokens: a threshold on it does not match
    assert engine.classify(_profile(stream=False, max_tokens=None)) == ("nonstream", "rule 2")
    assert engine.classify(_profile(stream=True, max_tokens=5)) == ("default", "default")


def test_choose_records_the_class_on_the_profile(classes_engine):
    profile = _request({"n": 2})
    decision = classes_engine.choose(profile, _fleet())
    assert decision.request_class == "fanout"
    assert profile.request_class == "fanout"
    assert decision.route.endswith("/fanout")


# --- routing ------------------------------------------------------------------------------------------

TIERED = """
routes:
  default:
    prefer: {pool: h100}
    fallback: {pool: mi300x}
    saturation: {max_waiting: 2, max_kv_cache_usage: 0.9, max_inflight: 5}
    strategy: {least-outstanding: 1}
"""


def test_preferred_before_fallback_even_when_busier():
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].inflight = 3
    by["h100-1"].inflight = 4
    decision = _engine(TIERED, backends).choose(_profile(), backends)
    assert _names(decision.candidates)[:2] == ["h100-0", "h100-1"]
    assert set(_names(decision.candidates)[2:]) == {"mi300x-0", "mi300x-1"}
    assert "spare-0" not in _names(decision.candidates)


@pytest.mark.parametrize(
    "saturate",
    [
        lambda b: setattr(b, "load", EngineLoad(waiting=3)),
        lambda b: setattr(b, "load", EngineLoad(kv_cache_usage=0.95)),
        lambda b: setattr(b, "inflight", 5),
    ],
    ids=["waiting", "kv-cache", "inflight"],
)
def test_saturated_preferred_goes_after_fallback(saturate):
    backends = _fleet()
    by = _by_name(backends)
    saturate(by["h100-0"])
    decision = _engine(TIERED, backends).choose(_profile(), backends)
    names = _names(decision.candidates)
    assert names[0] == "h100-1"
    assert set(names[1:3]) == {"mi300x-0", "mi300x-1"}
    assert names[3] == "h100-0"
    assert len(names) == 4


def test_at_the_limits_is_not_saturated():
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].load = EngineLoad(waiting=2, kv_cache_usage=0.9)
    by["h100-0"].inflight = 4
    by["h100-1"].inflight = 4
    names = _names(_engine(TIERED, backends).choose(_profile(), backends).candidates)
    assert set(names[:2]) == {"h100-0", "h100-1"}


@pytest.mark.parametrize(("ttft", "tpot"), [(0.5, None), (None, 0.08)], ids=["ttft", "tpot"])
def test_predicted_slo_miss_demotes(ttft, tpot):
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].observed.ttft = ttft
    by["h100-0"].observed.tpot = tpot
    engine = _engine(TIERED + "    slo: {ttft_ms: 200, tpot_ms: 50}\n", backends)
    names = _names(engine.choose(_profile(), backends).candidates)
    assert names[0] == "h100-1"
    assert names[-1] == "h100-0"


def test_queue_inflates_predicted_ttft_past_the_slo():
    backends = _fleet()
    by = _by_name(backends)
    # prior H100 TTFT 30 ms x (1 + 2/2) = 60 ms > 50 ms, with waiting (2) still within saturation
    by["h100-0"].load = EngineLoad(waiting=2)
    engine = _engine(TIERED + "    slo: {ttft_ms: 50}\n", backends)
    names = _names(engine.choose(_profile(), backends).candidates)
    assert names[0] == "h100-1" and names[-1] == "h100-0"


def test_unhealthy_and_short_context_never_candidates():
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].healthy = False
    by["mi300x-1"].max_model_len = 1000
    engine = _engine(TIERED, backends)
    names = _names(engine.choose(_profile(prompt_tokens_estimate=900, max_tokens=200), backends).candidates)
    assert names == ["h100-1", "mi300x-0"]


def test_pools_outside_the_route_are_never_used():
    backends = _fleet()
    by = _by_name(backends)
    for name in ("h100-0", "h100-1", "mi300x-0", "mi300x-1"):
        by[name].load = EngineLoad(waiting=50, kv_cache_usage=1.0)
    engine = _engine(TIERED, backends)
    decision = engine.choose(_profile(), backends)
    assert "spare-0" not in _names(decision.candidates)
    assert len(decision.candidates) == 4
    only_spare = [by["spare-0"]]
    decision = engine.choose(_profile(), only_spare)
    assert decision.candidates == []
    assert decision.why_none == "no pool of route `default` serves this model"
    assert decision.rejected_for_context is False


def test_nothing_fits_the_context():
    backends = _fleet(max_model_len=4096)
    by = _by_name(backends)
    by["h100-1"].max_model_len = 8192
    by["spare-0"].max_model_len = 131072  # outside the route: not the longest of the route
    decision = _engine(TIERED, backends).choose(
        _profile(prompt_tokens_estimate=9000, max_tokens=1000), backends
    )
    assert decision.candidates == []
    assert decision.rejected_for_context is True
    assert "10000 tokens" in decision.why_none
    assert "is 8192" in decision.why_none
    assert "131072" not in decision.why_none


def test_all_unavailable_lists_reasons():
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].healthy = False
    by["h100-1"].healthy = False
    by["mi300x-0"].healthy = False
    by["mi300x-1"].max_model_len = 500
    decision = _engine(TIERED, backends).choose(_profile(prompt_tokens_estimate=900), backends)
    assert decision.candidates == []
    assert decision.rejected_for_context is False
    assert decision.why_none.startswith("all 4 backends of route `default` are unavailable (")
    assert "failed its health check" in decision.why_none
    assert "max_model_len 500 < about 901 tokens needed" in decision.why_none


def test_exclude_saturated_filter_drops_them():
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].load = EngineLoad(waiting=3)
    engine = _engine(TIERED.replace("strategy:", "filters: [exclude-saturated]\n    strategy:"), backends)
    names = _names(engine.choose(_profile(), backends).candidates)
    assert "h100-0" not in names and len(names) == 3


def test_ties_rotate_across_calls():
    backends = _fleet()
    engine = _engine(TIERED.replace("    fallback: {pool: mi300x}\n", ""), backends)
    firsts = [engine.choose(_profile(), backends).candidates[0].name for _ in range(6)]
    assert Counter(firsts) == {"h100-0": 3, "h100-1": 3}
    assert firsts[0] != firsts[1]
    assert engine.decisions == 6


def test_ties_rotate_evenly_when_fallbacks_are_present():
    backends = _fleet()
    engine = _engine(TIERED, backends)
    firsts = [engine.choose(_profile(), backends).candidates[0].name for _ in range(8)]
    assert Counter(firsts) == {"h100-0": 4, "h100-1": 4}


# --- explain ------------------------------------------------------------------------------------------

EXPLAINED = """
classes:
  - name: chat
    when: {stream: true}
routes:
  chat:
    prefer: {vendor: nvidia}
    fallback: {pool: mi300x}
    slo: {ttft_ms: 300}
    saturation: {max_waiting: 2}
    strategy: {least-outstanding: 2, kv-headroom: 1, cheapest: 1}
  default: {}
"""


def _explained_state() -> list[Backend]:
    backends = _fleet()
    by = _by_name(backends)
    by["h100-0"].inflight = 1
    by["h100-1"].load = EngineLoad(running=3, waiting=3, kv_cache_usage=0.5)
    by["mi300x-0"].inflight = 2
    by["mi300x-0"].observed.ttft = 0.4
    by["mi300x-1"].healthy = False
    return backends


def _explanation(engine: PolicyEngine, profile: RequestProfile, backends: list[Backend]) -> Explanation:
    explained = explain(engine, profile, backends)
    assert explained.explanation is not None
    return explained.explanation


def test_explain():
    backends = _explained_state()
    engine = _engine(EXPLAINED, backends)
    explained = explain(engine, _profile(stream=True), backends)
    e = explained.explanation
    assert e is not None
    assert e.policy == "unnamed"
    assert e.version == engine.version != ""
    assert e.request_class == explained.request_class == "chat"
    assert e.matched_by == "rule 1"
    assert e.route["slo"] == {"ttft_ms": 300.0}
    candidates = e.candidates
    assert [c.backend for c in candidates] == explained.order
    # both others are unable to take more: among those, preferred before fallback
    assert [c.backend for c in candidates] == ["h100-0", "h100-1", "mi300x-0"]
    assert [c.tier for c in candidates] == ["preferred", "preferred", "fallback"]
    for c in candidates:
        assert set(c.scores) == {"least-outstanding", "kv-headroom", "cheapest"}
        assert all(0.0 <= s <= 1.0 for s in c.scores.values())
        weighted = (2 * c.scores["least-outstanding"] + c.scores["kv-headroom"] + c.scores["cheapest"]) / 4
        assert c.total == pytest.approx(weighted, abs=1e-3)
        assert 0.0 <= c.total <= 1.0
    h100_0, h100_1, mi300x_0 = candidates
    assert h100_0.can_take_more is True and h100_0.why_not is None
    assert h100_1.can_take_more is False and "3 requests waiting (limit 2)" in (h100_1.why_not or "")
    assert mi300x_0.can_take_more is False
    assert mi300x_0.why_not == "predicted TTFT 403 ms > SLO 300 ms"  # 400 ms measured + the prompt's prefill
    assert h100_0.scores["least-outstanding"] == 1.0
    assert msgspec.to_builtins(e.dropped) == [
        {"backend": "mi300x-1", "reason": "failed its health check"},
        {"backend": "spare-0", "reason": "its pool `spare` is not in route `chat`"},
    ]
    assert e.choice == "h100-0"
    assert e.decision_us >= 0
    assert engine.decisions == 0, "explaining is not routing: the statistics stay the traffic's"


def test_explain_choice_matches_choose():
    backends = _explained_state()
    engine = _engine(EXPLAINED, backends)
    explained = explain(engine, _profile(stream=True), backends)
    chosen = engine.choose(_profile(stream=True), backends)
    assert explained.explanation is not None
    assert explained.explanation.choice == chosen.candidates[0].name
    assert explained.order == _names(chosen.candidates)


def test_explain_when_nothing_fits():
    backends = _fleet()
    for b in backends:
        b.healthy = False
    explained = explain(_engine(EXPLAINED, backends), _profile(), backends)
    assert explained.order == []
    assert explained.why_none is not None and "failed its health check" in explained.why_none
    e = explained.explanation
    assert e is not None
    wire = msgspec.json.decode(msgspec.json.encode(e))
    assert "choice" not in wire and "candidates" not in wire
    assert e.request_class == "default"
    assert {d.reason for d in e.dropped} == {"failed its health check"}


def test_explain_of_a_router_without_a_policy_has_the_decision_only():
    backends = _fleet()
    explained = explain(LeastInflight(), _profile(), backends)
    assert explained.explanation is None
    assert sorted(explained.order) == sorted(_names(backends))


# --- third-party plugins ------------------------------------------------------------------------------

PLUGIN = """
from policies.registry import register


class Amd:
    name = "{name}"
    scores_in_unit_range = {declared}
    reads_predictions = False

    def score(self, ctx, candidates):
        return [{amd} if b.pool.vendor == "amd" else {nvidia} for b in candidates]


register("{name}", "scorer", Amd)
"""


@pytest.fixture
def plugin_module(tmp_path, monkeypatch):
    """Writes a scorer module into tmp_path; the registry and sys.modules are restored afterwards."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.syspath_prepend(str(tmp_path))
    written: list[str] = []

    def write(module: str, name: str, amd: float, nvidia: float, declared: str = "False") -> str:
        text = PLUGIN.format(name=name, amd=amd, nvidia=nvidia, declared=declared)
        if declared == "":
            text = text.replace("    scores_in_unit_range = \n", "")
        (tmp_path / f"{module}.py").write_text(text)
        written.append(module)
        return module

    yield write
    for module in written:
        sys.modules.pop(module, None)


PLUGIN_POLICY = """
imports: [{module}]
routes:
  default:
    prefer: any
    strategy: {strategy}
"""


def test_a_scorer_that_does_not_declare_its_capabilities_is_refused_at_load(plugin_module):
    module = plugin_module("switchyard_test_undeclared_scorer", "undeclared", 1.0, 0.0, declared="")
    backends = [b for b in _fleet() if b.pool.name != "spare"]
    text = PLUGIN_POLICY.format(module=module, strategy="{least-outstanding: 1, undeclared: 1}")
    with pytest.raises(ConfigError) as caught:
        _engine(text, backends)
    assert caught.value.line == 6
    assert "scorer `undeclared`" in str(caught.value) and "`scores_in_unit_range`" in str(caught.value)


def test_a_scorer_declaring_scores_in_unit_range_false_is_clamped(plugin_module):
    module = plugin_module("switchyard_test_wide_scorer", "wide", 7.0, -3.0)
    backends = [b for b in _fleet() if b.pool.name != "spare"]
    engine = _engine(PLUGIN_POLICY.format(module=module, strategy="{wide: 1}"), backends)
    scores = {c.backend: c.scores["wide"] for c in _explanation(engine, _profile(), backends).candidates}
    assert scores == {"h100-0": 0.0, "h100-1": 0.0, "mi300x-0": 1.0, "mi300x-1": 1.0}


def test_third_party_scorer_changes_the_choice(plugin_module):
    module = plugin_module("switchyard_test_amd_scorer", "likes-amd", 1.0, 0.0)
    backends = [b for b in _fleet() if b.pool.name != "spare"]
    by = _by_name(backends)
    by["mi300x-0"].inflight = by["mi300x-1"].inflight = 1
    plain = _engine(PLUGIN_POLICY.format(module=module, strategy="{least-outstanding: 1}"), backends)
    assert plain.choose(_profile(), backends).candidates[0].pool.name == "h100"
    assert "likes-amd" in registry.registered("scorer")
    engine = _engine(
        PLUGIN_POLICY.format(module=module, strategy="{least-outstanding: 1, likes-amd: 3}"), backends
    )
    e = _explanation(engine, _profile(), backends)
    assert e.candidates[0].pool == "mi300x"
    scores = {c.backend: c.scores["likes-amd"] for c in e.candidates}
    assert scores == {"h100-0": 0.0, "h100-1": 0.0, "mi300x-0": 1.0, "mi300x-1": 1.0}


def test_plugin_scores_outside_unit_range_are_clamped(plugin_module):
    module = plugin_module("switchyard_test_wild_scorer", "wild", 5.0, -1.0)
    backends = [b for b in _fleet() if b.pool.name != "spare"]
    engine = _engine(
        PLUGIN_POLICY.format(module=module, strategy="{wild: 1, least-outstanding: 1}"), backends
    )
    e = _explanation(engine, _profile(), backends)
    for c in e.candidates:
        expected = 1.0 if c.vendor == "amd" else 0.0
        assert c.scores["wild"] == expected
        assert c.total == pytest.approx((expected + 1.0) / 2)
    assert e.candidates[0].vendor == "amd"
