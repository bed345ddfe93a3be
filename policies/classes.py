"""Class rules compiled once into one plain function each, so matching a request costs one call and a few
comparisons (every request is matched against the rules in order until one holds).

A rule becomes the source of one expression over the profile `p`, compiled with `compile` as
`dataclasses` does for `__init__`: the source holds only what this module spells (the profile's
attribute names, comparison operators, `and`/`or`) and the names of constants (`_k0`, `_k1`...). The
policy file's values are those constants, bound as the function's globals, never text in its source, and
the function has no builtins: no rule can add code to it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from policies.config import Condition, Threshold
from policies.profile import RequestProfile

Predicate = Callable[[RequestProfile], bool]

_BOUNDS = (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<="), ("eq", "=="))
_THRESHOLDS = (("prompt_tokens", "prompt_tokens_estimate"), ("max_tokens", "max_tokens"), ("n", "n"))
"""A condition's numeric fields and the profile attribute each reads."""
_NAMED = (("priority", "priority"), ("key", "key_id"), ("tenant", "tenant"))
"""The fields besides `model` that name one value or several, and the profile attribute each reads."""


class _Constants:
    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def name(self, value: Any) -> str:
        """A name the expression reads `value` by (bound as a global of the compiled function)."""
        name = f"_k{len(self.values)}"
        self.values[name] = value
        return name


def _one_of(value: str | list[str]) -> frozenset[str]:
    return frozenset([value] if isinstance(value, str) else value)


def _threshold(attribute: str, t: Threshold, constants: _Constants) -> str:
    """`p.<attribute>` is set and within every bound of `t`."""
    tests = [f"p.{attribute} is not None"]
    tests += [
        f"p.{attribute} {op} {constants.name(getattr(t, bound))}"
        for bound, op in _BOUNDS
        if getattr(t, bound) is not None
    ]
    return "(" + " and ".join(tests) + ")"


def _headers(wanted: dict[str, str]) -> Predicate:
    return lambda p: all(p.header(k) == v for k, v in wanted.items())


def _expression(c: Condition, constants: _Constants) -> str:
    """The source of `c` over `p`: every field given must hold (AND), one of `any` (OR)."""
    tests: list[str] = []
    if c.model is not None:
        tests.append(f"p.model in {constants.name(_one_of(c.model))}")
    for field, attribute in _THRESHOLDS:
        threshold = getattr(c, field)
        if threshold is not None:
            tests.append(_threshold(attribute, threshold, constants))
    if c.stream is not None:
        tests.append(f"p.stream is {constants.name(c.stream)}")
    for field, attribute in _NAMED:
        if getattr(c, field) is not None:
            tests.append(f"p.{attribute} in {constants.name(_one_of(getattr(c, field)))}")
    if c.headers:
        tests.append(f"{constants.name(_headers(dict(c.headers)))}(p)")
    if c.any:
        tests.append("(" + " or ".join(_expression(alt, constants) for alt in c.any) + ")")
    if not tests:
        return "True"
    return "(" + " and ".join(tests) + ")"


def compile_condition(c: Condition) -> Predicate:
    constants = _Constants()
    source = "lambda p: " + _expression(c, constants)
    code = compile(source, "<class rule>", "eval")
    return cast(Predicate, eval(code, {"__builtins__": {}, **constants.values}))
