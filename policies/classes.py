"""Class rules compiled into plain predicates once, so matching a request costs a few comparisons."""

from __future__ import annotations

import operator
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


_BOUNDS = (
    ("gt", operator.gt),
    ("gte", operator.ge),
    ("lt", operator.lt),
    ("lte", operator.le),
    ("eq", operator.eq),
)


def _threshold(read: Callable[[RequestProfile], Any], t: Threshold) -> Predicate:
    """`read(p)` is set and within every bound of `t`: one Python call, the comparisons in C."""
    bounds = [(op, getattr(t, name)) for name, op in _BOUNDS if getattr(t, name) is not None]
    if not bounds:
        return lambda p: read(p) is not None
    if len(bounds) == 1:
        ((op, a),) = bounds
        return lambda p: (v := read(p)) is not None and op(v, a)
    if len(bounds) == 2:
        (op_a, a), (op_b, b) = bounds
        return lambda p: (v := read(p)) is not None and op_a(v, a) and op_b(v, b)
    return lambda p: (v := read(p)) is not None and all(op(v, x) for op, x in bounds)


def compile_condition(c: Condition) -> Predicate:
    tests: list[Predicate] = []
    if c.model is not None:
        models = _one_of(c.model)
        tests.append(lambda p: p.model in models)
    if c.prompt_tokens is not None:
        tests.append(_threshold(operator.attrgetter("prompt_tokens_estimate"), c.prompt_tokens))
    if c.max_tokens is not None:
        tests.append(_threshold(operator.attrgetter("max_tokens"), c.max_tokens))
    if c.n is not None:
        tests.append(_threshold(operator.attrgetter("n"), c.n))
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
