"""What an API key's request may tell routing: its hints capped by the key, before the policy reads them.

A client hints at its class with `x-switchyard-priority` (or `metadata.priority`), `x-switchyard-class`
and any header the policy reads (its `headers:` mapping, rules' `when.headers`). A key allows priorities
up to `max_priority` and, when `classes` is set, only those classes. This is the one place the key's
allowance is applied: the policy engine gets a profile holding only the hints the key may give, so no
rule can read one it may not, and every hint dropped is named for `x-switchyard-hints-ignored`.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.tenants.keys import PRIORITY_RANK, KeyRecord
from policies.hints import HeaderHints
from policies.profile import RequestProfile

ClassOf = Callable[[RequestProfile], tuple[str, str]]
"""The class the policy gives a profile, and what decided it (`PolicyEngine.classify`)."""

PRIORITY_HEADER = b"x-switchyard-priority"
CLASS_HEADER = b"x-switchyard-class"


def priority_allowed(priority: str, key: KeyRecord) -> bool:
    """A key may ask for its own priority or a lower one; a value the gateway does not rank (a policy
    may still match it) only with `max_priority: high`, which allows everything."""
    ceiling = PRIORITY_RANK[key.max_priority]
    return ceiling == 0 or PRIORITY_RANK.get(priority, 0) >= ceiling


def apply_allowance(
    profile: RequestProfile, key: KeyRecord, hints: HeaderHints | None, class_of: ClassOf | None
) -> list[str]:
    """Cap `profile`'s hints by `key` in place; returns the hints ignored (`priority`, `class`, or the
    name of another header)."""
    ignored: list[str] = []
    profile.key_id = key.id
    profile.tenant = key.team
    default_priority = key.max_priority if PRIORITY_RANK[key.max_priority] > 1 else None
    asked = profile.priority
    if asked is not None and not priority_allowed(asked, key):
        ignored.append("priority")
        asked = None
    profile.priority = asked if asked is not None else default_priority
    allowed = key.classes
    if profile.explicit_class is not None and allowed and profile.explicit_class not in allowed:
        ignored.append("class")
        profile.explicit_class = None
    headers = profile.headers
    if headers:
        kept, priority_dropped = _allowed_headers(headers, key, hints, ignored)
        profile.headers = kept
        if priority_dropped and asked is not None:  # its header named a class the key may not use
            asked = None
            profile.priority = default_priority
    if allowed and asked not in (None, default_priority) and class_of is not None:
        # The policy's rules read the priority too: one the key may give must not lead to a class it
        # may not use (unless the request is in that class without it).
        cls = class_of(profile)[0]
        if cls not in allowed:
            profile.priority = default_priority
            if class_of(profile)[0] == cls:
                profile.priority = asked
            else:
                ignored.append("priority")
    return ignored


def _allowed_headers(
    headers: list[tuple[bytes, bytes]], key: KeyRecord, hints: HeaderHints | None, ignored: list[str]
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """`headers` itself when the key may give all of them, else a copy without the others; and whether
    an `x-switchyard-priority` was among those dropped."""
    names = hints.names if hints is not None else frozenset()
    priority_refused, class_refused = "priority" in ignored, "class" in ignored
    dropped: list[int] = []
    priority_dropped = False
    for index, (name, value) in enumerate(headers):
        if name == PRIORITY_HEADER:
            hint, refused = "priority", priority_refused
        elif name == CLASS_HEADER:
            hint, refused = "class", class_refused
        elif name in names:
            hint, refused = name.decode("latin-1"), False
        else:
            continue
        if refused or not _leads_to_allowed(name, value, key, hints):
            dropped.append(index)
            priority_dropped = priority_dropped or name == PRIORITY_HEADER
            if hint not in ignored:
                ignored.append(hint)
    if not dropped:
        return headers, False
    return [header for index, header in enumerate(headers) if index not in dropped], priority_dropped


def _leads_to_allowed(name: bytes, value: bytes, key: KeyRecord, hints: HeaderHints | None) -> bool:
    if name == PRIORITY_HEADER and not priority_allowed(value.decode("latin-1"), key):
        return False
    if not key.classes or hints is None or name not in hints.names:
        return True
    return all(cls in key.classes for cls in hints.classes(name, value))
