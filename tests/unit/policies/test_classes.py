"""Each bound of a class rule's threshold holds at its edge, and several bounds hold together; a compiled
rule holds exactly when a plain reading of it does, whatever the rule and the request."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.classes import compile_condition
from policies.config import Condition, Threshold
from policies.profile import RequestProfile


def _profile(prompt_tokens: int, max_tokens: int | None = None) -> RequestProfile:
    return RequestProfile(
        model="m", prompt_tokens_estimate=prompt_tokens, context_needed=prompt_tokens, max_tokens=max_tokens
    )


@pytest.mark.parametrize(
    ("threshold", "matching", "not_matching"),
    [
        (Threshold(gt=100), [101], [100, 99]),
        (Threshold(gte=100), [100, 101], [99]),
        (Threshold(lt=100), [99], [100, 101]),
        (Threshold(lte=100), [99, 100], [101]),
        (Threshold(eq=100), [100], [99, 101]),
        (Threshold(gte=2, lte=8), [2, 5, 8], [1, 9]),
        (Threshold(gt=2, lt=8, eq=5), [5], [4, 6]),
        (Threshold(gt=1, gte=2, lt=9, lte=8), [2, 8], [1, 9]),
    ],
)
def test_threshold_bounds(threshold: Threshold, matching: list[int], not_matching: list[int]) -> None:
    matches = compile_condition(Condition(prompt_tokens=threshold))
    assert [matches(_profile(v)) for v in matching] == [True] * len(matching)
    assert [matches(_profile(v)) for v in not_matching] == [False] * len(not_matching)


def test_a_threshold_never_matches_a_missing_value() -> None:
    assert not compile_condition(Condition(max_tokens=Threshold(lt=100)))(_profile(10, max_tokens=None))
    assert not compile_condition(Condition(max_tokens=Threshold()))(_profile(10, max_tokens=None))
    assert compile_condition(Condition(max_tokens=Threshold()))(_profile(10, max_tokens=0))


# --- the compiled function against a plain reading of the rule, on any rule and any request ---------------


def _reference(c: Condition, p: RequestProfile) -> bool:
    """What a rule means, read out field by field (docs/policies.md), slowly and plainly."""

    def one_of(wanted: str | list[str] | None, value: str | None) -> bool:
        return wanted is None or value in ([wanted] if isinstance(wanted, str) else wanted)

    def within(t: Threshold | None, value: float | None) -> bool:
        if t is None:
            return True
        if value is None:
            return False
        return (
            (t.gt is None or value > t.gt)
            and (t.gte is None or value >= t.gte)
            and (t.lt is None or value < t.lt)
            and (t.lte is None or value <= t.lte)
            and (t.eq is None or value == t.eq)
        )

    return (
        one_of(c.model, p.model)
        and within(c.prompt_tokens, p.prompt_tokens_estimate)
        and within(c.max_tokens, p.max_tokens)
        and within(c.n, p.n)
        and (c.stream is None or p.stream == c.stream)
        and one_of(c.priority, p.priority)
        and one_of(c.key, p.key_id)
        and one_of(c.tenant, p.tenant)
        and all(p.header(k) == v for k, v in (c.headers or {}).items())
        and (not c.any or any(_reference(alt, p) for alt in c.any))
    )


_names = st.sampled_from(["a", "b", "c"])
_one_or_more = st.none() | _names | st.lists(_names, min_size=1, max_size=2)
_bound = st.none() | st.sampled_from([0, 1, 2, 64, 100, 256.5, 2048])
_thresholds = st.none() | st.builds(Threshold, gt=_bound, gte=_bound, lt=_bound, lte=_bound, eq=_bound)
_headers = st.none() | st.dictionaries(st.sampled_from(["x-team", "x-tier"]), _names, max_size=2)


def _conditions(alternatives: st.SearchStrategy[list[Condition] | None]) -> st.SearchStrategy[Condition]:
    return st.builds(
        Condition,
        model=_one_or_more,
        prompt_tokens=_thresholds,
        max_tokens=_thresholds,
        n=_thresholds,
        stream=st.none() | st.booleans(),
        priority=_one_or_more,
        key=_one_or_more,
        tenant=_one_or_more,
        headers=_headers,
        any=alternatives,
    )


_rules = _conditions(st.one_of(st.none(), st.lists(_conditions(st.none()), min_size=1, max_size=3)))
_profiles = st.builds(
    RequestProfile,
    model=_names,
    prompt_tokens_estimate=st.sampled_from([0, 1, 2, 64, 100, 101, 256, 257, 2048, 9000]),
    context_needed=st.just(0),
    stream=st.booleans(),
    key_id=_names,
    max_tokens=st.none() | st.sampled_from([0, 1, 2, 64, 100, 256, 257, 2048, 2049]),
    n=st.sampled_from([1, 2, 64]),
    priority=st.none() | _names,
    tenant=st.none() | _names,
    headers=st.none()
    | st.lists(st.tuples(st.sampled_from([b"x-team", b"x-tier", b"other"]), st.sampled_from([b"a", b"b"]))),
)


@settings(max_examples=400, deadline=None)
@given(rule=_rules, profiles=st.lists(_profiles, min_size=1, max_size=8))
def test_a_compiled_rule_holds_exactly_when_the_rule_reads_true(
    rule: Condition, profiles: list[RequestProfile]
) -> None:
    matches = compile_condition(rule)
    assert [matches(p) for p in profiles] == [_reference(rule, p) for p in profiles]


def test_a_rules_values_are_constants_never_source() -> None:
    """A value that would be code in the source is only ever compared against."""
    hostile = "a) or __import__('os').system('false') or (1"
    matches = compile_condition(
        Condition(model=hostile, priority=[hostile, "x"], headers={"x-team": hostile})
    )
    profile = RequestProfile(model=hostile, prompt_tokens_estimate=1, context_needed=1, priority="x")
    assert not matches(profile)  # the header is missing
    profile.headers = [(b"x-team", hostile.encode())]
    assert matches(profile)
