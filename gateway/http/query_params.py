"""A query parameter given twice is refused: whatever checks one value and whatever uses one must see
the same one (a guard reading the first `by=` while the handler reads the last let a tenant pass one
check and get another answer)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from gateway.openai.errors import invalid_request


def refuse_repeated(query_string: bytes) -> None:
    """400 `duplicate_parameter` when a name appears twice in the query string."""
    if not query_string:
        return
    seen: set[str] = set()
    for name, _ in parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
        if name in seen:
            raise invalid_request(
                f"The query parameter `{name}` is given more than once; give it once.",
                param=name,
                code="duplicate_parameter",
            )
        seen.add(name)
