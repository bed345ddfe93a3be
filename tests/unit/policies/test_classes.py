"""Each bound of a class rule's threshold holds at its edge, and several bounds hold together."""

from __future__ import annotations

import pytest

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
