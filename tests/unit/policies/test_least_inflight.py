"""LeastInflight: fit the context, skip unhealthy backends, fewest in flight first, ties rotate."""

from __future__ import annotations

import itertools
from collections import Counter

from backends.models import Backend, Pool
from policies.least_inflight import LeastInflight
from policies.profile import RequestProfile

POOL = Pool(
    name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)


def _backend(name: str, max_model_len: int = 8192, inflight: int = 0, healthy: bool = True) -> Backend:
    return Backend(
        name=name,
        url="http://127.0.0.1:1",
        models=frozenset({"m"}),
        max_model_len=max_model_len,
        pool=POOL,
        healthy=healthy,
        inflight=inflight,
    )


def _profile(context_needed: int = 100) -> RequestProfile:
    return RequestProfile(
        model="m",
        prompt_tokens_estimate=context_needed - 1,
        context_needed=context_needed,
        stream=False,
        key_id="anonymous",
        request_class="default",
    )


def _names(backends: list[Backend]) -> list[str]:
    return [b.name for b in backends]


def test_filters_backends_whose_context_is_too_small():
    small, big = _backend("small", max_model_len=2048), _backend("big", max_model_len=32768)
    decision = LeastInflight().choose(_profile(4000), [small, big])
    assert _names(decision.candidates) == ["big"]
    assert decision.route == "least-inflight"
    assert decision.why_none is None
    assert decision.rejected_for_context is False


def test_exact_fit_is_accepted():
    decision = LeastInflight().choose(_profile(2048), [_backend("a", max_model_len=2048)])
    assert _names(decision.candidates) == ["a"]


def test_nothing_fits_the_context():
    serving = [_backend("a", max_model_len=2048), _backend("b", max_model_len=4096, healthy=False)]
    decision = LeastInflight().choose(_profile(5000), serving)
    assert decision.candidates == []
    assert decision.rejected_for_context is True
    assert decision.why_none is not None
    assert "5000" in decision.why_none
    assert "longest served for this model is 4096" in decision.why_none


def test_unhealthy_backends_are_skipped():
    serving = [_backend("sick", healthy=False), _backend("well", inflight=7)]
    decision = LeastInflight().choose(_profile(), serving)
    assert _names(decision.candidates) == ["well"]


def test_all_fitting_backends_unhealthy():
    serving = [_backend("a", healthy=False), _backend("b", healthy=False), _backend("tiny", max_model_len=10)]
    decision = LeastInflight().choose(_profile(100), serving)
    assert decision.candidates == []
    assert decision.rejected_for_context is False
    assert decision.why_none is not None
    assert "unhealthy" in decision.why_none
    assert "2" in decision.why_none


def test_no_backends_at_all():
    decision = LeastInflight().choose(_profile(), [])
    assert decision.candidates == []
    assert decision.why_none is not None


def test_orders_by_inflight():
    serving = [_backend("busy", inflight=9), _backend("idle", inflight=0), _backend("some", inflight=3)]
    router = LeastInflight()
    for _ in range(5):
        assert _names(router.choose(_profile(), serving).candidates) == ["idle", "some", "busy"]


def test_every_candidate_appears_once_as_fallback():
    serving = [_backend(f"b{i}", inflight=i % 3) for i in range(7)]
    decision = LeastInflight().choose(_profile(), serving)
    assert sorted(_names(decision.candidates)) == sorted(_names(serving))
    inflights = [b.inflight for b in decision.candidates]
    assert inflights == sorted(inflights)


def test_ties_rotate_so_idle_backends_share_load():
    serving = [_backend("a"), _backend("b"), _backend("c")]
    router = LeastInflight()
    firsts = Counter(router.choose(_profile(), serving).candidates[0].name for _ in range(30))
    assert firsts == {"a": 10, "b": 10, "c": 10}


def test_consecutive_idle_choices_differ():
    serving = [_backend("a"), _backend("b")]
    router = LeastInflight()
    picks = [router.choose(_profile(), serving).candidates[0].name for _ in range(6)]
    assert all(x != y for x, y in itertools.pairwise(picks))


def test_ties_rotate_only_among_the_least_loaded():
    serving = [_backend("a"), _backend("busy", inflight=4), _backend("b")]
    router = LeastInflight()
    seen = Counter()
    for _ in range(12):
        candidates = router.choose(_profile(), serving).candidates
        assert candidates[-1].name == "busy"
        seen[candidates[0].name] += 1
    assert set(seen) == {"a", "b"}
    assert min(seen.values()) >= 4
