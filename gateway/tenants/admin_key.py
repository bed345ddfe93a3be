"""The bootstrap admin key must be one a generator made, not one a person typed.

How random a string was cannot be read off the string; these rules refuse what people type and accept
what `openssl rand -hex 16` (or longer, or `secrets.token_urlsafe(32)`) makes. A key is weak when:

1. it has fewer than 32 characters;
2. it is a shorter string repeated (`abcdabcd...`, `password1234password1234...`);
3. its characters carry under 75 bits by their own statistics: length x the Shannon entropy of the
   key's character frequencies (`aaaa...b`, `0000...1` = 62 bits). 32 random hex characters scored
   89.6 bits at the least in 1,000,000 draws, but one of a test's draws scored 84.8
   (`fb01bf31eff11100abb051101b1ac011`), which the old bound of 85 refused; 48 score about 180.

A weak key refuses to start the gateway unless `auth.allow_weak_admin_key: true`, `serve
--allow-weak-admin-key` or SWITCHYARD_ALLOW_WEAK_ADMIN_KEY=1 allows it; then every start logs a warning.
"""

from __future__ import annotations

import math
import os
from collections import Counter

MIN_LENGTH = 32
MIN_BITS = 75.0
ALLOW_ENV = "SWITCHYARD_ALLOW_WEAK_ADMIN_KEY"
"""Set to 1 by `serve --allow-weak-admin-key` (so worker processes inherit it), or by an operator."""


class WeakAdminKey(ValueError):
    """The admin key is weak and nothing allows it."""


def estimated_bits(key: str) -> float:
    counts = Counter(key)
    n = len(key)
    return -n * sum(c / n * math.log2(c / n) for c in counts.values()) if n else 0.0


def _repeats(key: str) -> bool:
    """`key` is some shorter string written out twice or more."""
    return len(key) > 1 and (key + key).find(key, 1) < len(key)


def admin_key_weakness(key: str) -> str | None:
    """Why `key` is weak, or None when it is strong enough."""
    if len(key) < MIN_LENGTH:
        return f"it has {len(key)} characters, fewer than {MIN_LENGTH}"
    if _repeats(key):
        return "it is a shorter string repeated"
    bits = estimated_bits(key)
    if bits < MIN_BITS:
        return f"its characters are too uniform ({bits:.0f} bits estimated, under {MIN_BITS:.0f})"
    return None


def check_admin_key(variable: str, allow_weak: bool) -> str | None:
    """None when $`variable` is unset or strong; the warning to log when it is weak but allowed (by
    `allow_weak`, the config's flag, or $SWITCHYARD_ALLOW_WEAK_ADMIN_KEY); raises WeakAdminKey otherwise."""
    material = os.environ.get(variable)
    reason = admin_key_weakness(material) if material else None
    if reason is None:
        return None
    if allow_weak or os.environ.get(ALLOW_ENV, "").strip().lower() in ("1", "true", "yes"):
        return _warning(variable, reason)
    raise WeakAdminKey(_refusal(variable, reason))


def _refusal(variable: str, reason: str) -> str:
    return (
        f"the admin key in ${variable} is weak: {reason}. Use a generated one "
        "(`openssl rand -hex 24`), or allow a weak key on purpose with `auth.allow_weak_admin_key: true` "
        f"or `switchyard serve --allow-weak-admin-key` (or {ALLOW_ENV}=1)"
    )


def _warning(variable: str, reason: str) -> str:
    return (
        f"WEAK ADMIN KEY in ${variable} ({reason}), allowed by allow_weak_admin_key: anyone who guesses "
        "it controls this gateway; failed guesses are slowed per address, not stopped"
    )
