"""The engine's hot loop inlines policies/predict.py's formulas (queue, TTFT, saturation); on random backend
states, routes and requests its predictions and its "can take more" verdicts equal the definitions."""

from __future__ import annotations

import textwrap

from hypothesis import given, settings
from hypothesis import strategies as st

from backends.models import Backend, EngineLoad, Observed
from policies.config import parse_policy
from policies.engine import PolicyEngine
from policies.predict import (
    Recent,
    predicted_tpot,
    queue_estimate,
    saturation_reason,
    ttft_estimate,
)
from policies.profile import RequestProfile, context_needed
from tests.unit.policies.test_overload import MODEL, _fleet

SCRAPES = (100.0, 101.0)

backend_state = st.fixed_dictionaries(
    {
        "waiting": st.sampled_from([0.0, 0.0, 1.0, 3.0, 4.0, 5.0, 12.0]),
        "running": st.sampled_from([0.0, 1.0, 30.0]),
        "kv": st.floats(0.0, 1.0),
        "scraped_at": st.sampled_from(SCRAPES),
        "inflight": st.integers(0, 40),
        "extra_seqs": st.integers(0, 40),
        "ttft": st.none() | st.floats(0.005, 3.0),
        "tpot": st.none() | st.floats(0.002, 0.2),
        "recent": st.none() | st.tuples(st.sampled_from(SCRAPES), st.integers(0, 12), st.integers(0, 60_000)),
    }
)

route_shape = st.fixed_dictionaries(
    {
        "max_waiting": st.sampled_from([0, 1, 4, 8]),
        "max_kv": st.sampled_from([0.5, 0.8, 0.95, 1.0]),
        "max_inflight": st.none() | st.integers(1, 30),
        "max_seqs": st.none() | st.integers(1, 60),
        "max_tpot_ms": st.none() | st.sampled_from([5.0, 20.0, 80.0]),
        "max_slowdown": st.none() | st.sampled_from([1.5, 6.0]),
        "ttft_ms": st.none() | st.sampled_from([100.0, 800.0, 5000.0]),
        "tpot_ms": st.none() | st.sampled_from([10.0, 50.0]),
        "strategy": st.sampled_from(["{least-outstanding: 1}", "{fastest-predicted: 1}"]),
    }
)


def _policy(shape: dict) -> str:
    saturation = {
        "max_waiting": shape["max_waiting"],
        "max_kv_cache_usage": shape["max_kv"],
        "max_inflight": shape["max_inflight"],
        "max_seqs": shape["max_seqs"],
        "max_tpot_ms": shape["max_tpot_ms"],
        "max_slowdown": shape["max_slowdown"],
    }
    limits = ", ".join(f"{k}: {v}" for k, v in saturation.items() if v is not None)
    slo = {"ttft_ms": shape["ttft_ms"], "tpot_ms": shape["tpot_ms"]}
    slo_text = ", ".join(f"{k}: {v}" for k, v in slo.items() if v is not None)
    return textwrap.dedent(
        f"""
        routes:
          default:
            prefer: any
            strategy: {shape["strategy"]}
            saturation: {{{limits}}}
        """
    ) + (f"    slo: {{{slo_text}}}\n" if slo_text else "")


def _set(backend: Backend, state: dict, engine: PolicyEngine) -> None:
    backend.load = EngineLoad(
        running=state["running"],
        waiting=state["waiting"],
        kv_cache_usage=state["kv"],
        scraped_at=state["scraped_at"],
    )
    backend.inflight = state["inflight"]
    backend.inflight_seqs = state["inflight"] + state["extra_seqs"]
    backend.observed = Observed(ttft=state["ttft"], tpot=state["tpot"])
    recent = state["recent"]
    if recent is None:
        engine.recent.by_backend.pop(backend, None)
    else:
        scraped_at, requests, tokens = recent
        engine.recent.by_backend[backend] = Recent(scraped_at, requests, tokens)


FLEET = _fleet()


@settings(max_examples=500, deadline=None)
@given(
    states=st.lists(backend_state, min_size=len(FLEET), max_size=len(FLEET)),
    shape=route_shape,
    prompt=st.integers(1, 7_000),
)
def test_the_inlined_predictions_and_verdicts_equal_the_definitions(states, shape, prompt):
    engine = PolicyEngine(parse_policy(_policy(shape), "<property>"), FLEET)
    for backend, state in zip(FLEET, states, strict=True):
        _set(backend, state, engine)
    limits = engine.loaded.policy.routes["default"].saturation
    recent = engine.recent
    # The definitions, computed before the decision counts its own send.
    expected_ttft, expected_able, within_limits = {}, {}, {}
    ttft_limit = shape["ttft_ms"] / 1000 if shape["ttft_ms"] is not None else float("inf")
    tpot_limit = shape["tpot_ms"] / 1000 if shape["tpot_ms"] is not None else float("inf")
    for b in FLEET:
        seen = recent.get(b)
        queue = queue_estimate(b, seen, limits.max_kv_cache_usage)
        ttft = ttft_estimate(b, seen, queue, prompt, recent.prefill_speed(b))
        expected_ttft[b] = ttft
        within = within_limits[b] = saturation_reason(b, limits, recent) is None
        expected_able[b] = within and ttft <= ttft_limit and predicted_tpot(b) <= tpot_limit

    profile = RequestProfile(
        model=MODEL, prompt_tokens_estimate=prompt, max_tokens=16, context_needed=context_needed(prompt, 16)
    )
    _, trace = engine.decide_traced(profile, FLEET)

    assert trace.ctx is not None and trace.kept == FLEET
    predicts = shape["ttft_ms"] is not None or shape["tpot_ms"] is not None
    predicts = predicts or shape["strategy"] == "{fastest-predicted: 1}"
    if predicts:
        assert trace.ctx.predicted_ttft == [expected_ttft[b] for b in FLEET]
        assert trace.ctx.predicted_tpot == [predicted_tpot(b) for b in FLEET]
        assert trace.able == [expected_able[b] for b in FLEET]
    else:
        assert trace.ctx.predicted_ttft is None
        assert trace.able == [within_limits[b] for b in FLEET]


_MAPPED = textwrap.dedent(
    """
    name: mapped
    headers:
      priority: {u=5: batch, u=6: batch}
      x-request-priority: {high: interactive, low: batch}
      x-tier: {gold: interactive, bronze: batch}
    classes:
      - name: interactive
        when: {stream: true}
      - name: batch
        when: {n: {gte: 2}}
    routes:
      interactive: {}
      batch: {}
      default: {}
    """
)
_MAPPED_POLICY = parse_policy(_MAPPED, "<test>")
_MAPPED_ENGINE = PolicyEngine(_MAPPED_POLICY, _fleet())  # built once: `_mapped_header` changes nothing
_header_names = st.sampled_from([b"priority", b"x-request-priority", b"x-tier", b"host", b"authorization"])
_header_values = st.sampled_from(
    [b"u=5", b"u=6, i", b"U=5", b"high", b" LOW ", b"gold", b"bronze", b"x", b""]
)


def _mapped_by_definition(
    policy: dict[str, dict[str, str]], headers: list[tuple[bytes, bytes]]
) -> str | None:
    """The policy's `headers:` in its order; for each, the first request header of that name whose first
    comma-separated item names a class (trimmed, case-insensitive)."""
    for name, values in policy.items():
        for key, raw in headers:
            if key == name.encode("latin-1"):
                cls = values.get(raw.decode("latin-1").split(",", 1)[0].strip().lower())
                if cls is not None:
                    return cls
    return None


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(_header_names, _header_values), max_size=8))
def test_the_one_pass_header_mapping_gives_the_class_the_policy_order_gives(
    headers: list[tuple[bytes, bytes]],
) -> None:
    assert list(_MAPPED_POLICY.policy.headers) == ["priority", "x-request-priority", "x-tier"]
    expected = _mapped_by_definition(_MAPPED_POLICY.policy.headers, headers)
    assert _MAPPED_ENGINE._mapped_header(headers) == expected
