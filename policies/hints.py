"""The request headers a policy reads to choose a class, and which classes each value can lead to.

A client's header is a hint: with API keys the gateway lets the policy see only the hints the key may
give (gateway/request/allowance.py). Two parts of a policy read headers: the `headers:` mapping (the
header's first comma-separated item, case-insensitively, names a class) and class rules' `when.headers`
(an exact value; the rule's class).
"""

from __future__ import annotations

from policies.config import Condition, PolicyFile


class HeaderHints:
    __slots__ = ("_mapped", "_ruled", "names")

    def __init__(self, policy: PolicyFile) -> None:
        self._mapped: dict[bytes, dict[str, str]] = {
            name.encode("latin-1"): values for name, values in policy.headers.items()
        }
        self._ruled: dict[bytes, list[tuple[str, str]]] = {}
        for rule in policy.classes:
            if rule.when is not None:
                self._collect(rule.when, rule.name)
        self.names: frozenset[bytes] = frozenset(self._mapped) | frozenset(self._ruled)
        """Every header name the policy reads (lower case, as ASGI gives them)."""

    def _collect(self, condition: Condition, cls: str) -> None:
        for name, value in (condition.headers or {}).items():
            self._ruled.setdefault(name.lower().encode("latin-1"), []).append((value, cls))
        for alternative in condition.any or ():
            self._collect(alternative, cls)

    def classes(self, name: bytes, raw: bytes) -> list[str]:
        """The classes this header's value can put a request in (empty: the policy ignores the value)."""
        out: list[str] = []
        values = self._mapped.get(name)
        if values is not None:
            cls = values.get(raw.decode("latin-1").split(",", 1)[0].strip().lower())
            if cls is not None:
                out.append(cls)
        ruled = self._ruled.get(name)
        if ruled is not None:
            text = raw.decode("latin-1")
            out.extend(cls for value, cls in ruled if value == text)
        return out
