"""Class rules compiled into plain predicates once, so matching a request costs a few comparisons."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from policies.config import Condition, Threshold
from policies.profile import RequestProfile

Predicate = Callable[[RequestProfile], bool]


def _one_of(value: str | list[str]) -> frozenset[str]:
    return frozenset([value] if isinstance(value, str) else value)


def _all(tests: list[Callable[[Any], bool]]) -> Callable[[Any], bool]:
    """AND of the tests, without a generator per call (this runs for every request)."""
    if len(tests) == 1:
        return tests[0]
    if len(tests) == 2:
        a, b = tests
        return lambda p: a(p) and b(p)
    if len(tests) == 3:
        a, b, c = tests
        return lambda p: a(p) and b(p) and c(p)

    def check(p: Any) -> bool:
        for test in tests:  # noqa: SIM110 - a plain loop is cheaper than all()/any() over a generator
            if not test(p):
                return False
        return True

    return check


def _any(tests: list[Predicate]) -> Predicate:
    if len(tests) == 1:
        return tests[0]

    def check(p: RequestProfile) -> bool:
        for test in tests:  # noqa: SIM110 - a plain loop is cheaper than all()/any() over a generator
            if test(p):
                return True
        return False

    return check


def _threshold(t: Threshold) -> Callable[[float | None], bool]:
    tests: list[Callable[[Any], bool]] = []
    gt, gte, lt, lte, eq = t.gt, t.gte, t.lt, t.lte, t.eq
    if gt is not None:
        tests.append(lambda v: v > gt)
    if gte is not None:
        tests.append(lambda v: v >= gte)
    if lt is not None:
        tests.append(lambda v: v < lt)
    if lte is not None:
        tests.append(lambda v: v <= lte)
    if eq is not None:
        tests.append(lambda v: v == eq)
    if not tests:
        return lambda v: v is not None
    combined = _all(tests)
    return lambda v: v is not None and combined(v)


def compile_condition(c: Condition) -> Predicate:
    tests: list[Predicate] = []
    if c.model is not None:
        models = _one_of(c.model)
        tests.append(lambda p: p.model in models)
    if c.prompt_tokens is not None:
        check = _threshold(c.prompt_tokens)
        tests.append(lambda p: check(p.prompt_tokens_estimate))
    if c.max_tokens is not None:
        check_max = _threshold(c.max_tokens)
        tests.append(lambda p: check_max(p.max_tokens))
    if c.n is not None:
        check_n = _threshold(c.n)
        tests.append(lambda p: check_n(p.n))
    if c.stream is not None:
        stream = c.stream
        tests.append(lambda p: p.stream is stream)
    if c.priority is not None:
        priorities = _one_of(c.priority)
        tests.append(lambda p: p.priority in priorities)
    if c.key is not None:
        keys = _one_of(c.key)
        tests.append(lambda p: p.key_id in keys)
    if c.tenant is not None:
        tenants = _one_of(c.tenant)
        tests.append(lambda p: p.tenant in tenants)
    if c.headers:
        wanted = dict(c.headers)
        tests.append(lambda p: all(p.header(k) == v for k, v in wanted.items()))
    if c.any:
        tests.append(_any([compile_condition(alt) for alt in c.any]))
    if not tests:
        return lambda p: True
    return _all(tests)
