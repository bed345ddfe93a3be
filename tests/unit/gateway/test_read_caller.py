"""`read_caller` reads a request's headers with one table lookup each: held to a plain reading of what each
header means, on any list of headers (SDK-like ones, the headers it reads, duplicates, any order)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.credentials import duplicate_header
from gateway.http.routes import read_caller, valid_request_id
from gateway.openai.errors import GatewayError

READ = [
    b"authorization",
    b"x-api-key",
    b"x-request-id",
    b"traceparent",
    b"tracestate",
    b"x-switchyard-priority",
    b"x-switchyard-class",
    b"x-switchyard-tenant",
    b"x-session-id",
]
OTHERS = [b"host", b"content-type", b"x-stainless-lang", b"x-stainless-retry-count", b"user-agent", b"x-"]


def _plain(headers: list[tuple[bytes, bytes]]) -> dict[str, Any] | str:
    """What the caller should hold, by header (the last of a repeated hint wins, as a plain assignment
    does), or the error a repeated credential gives."""
    seen: dict[bytes, int] = {}
    for name, _ in headers:
        seen[name] = seen.get(name, 0) + 1
        if name in (b"authorization", b"x-api-key") and seen[name] > 1:
            return repr(duplicate_header(name).body)

    def last(name: bytes) -> str | None:
        values = [v.decode("latin-1") for n, v in headers if n == name]
        return values[-1] if values else None

    ids = [v.decode("latin-1") for n, v in headers if n == b"x-request-id"]
    valid = [text for text in ids if valid_request_id(text)]
    forwarded = {n.decode(): last(n) for n in (b"traceparent", b"tracestate") if last(n) is not None}
    return {
        "authorization": last(b"authorization"),
        "client_request_id": valid[-1] if valid else None,
        "forwarded": forwarded,
        "priority": last(b"x-switchyard-priority"),
        "explicit_class": last(b"x-switchyard-class"),
        "tenant": last(b"x-switchyard-tenant"),
        "session": last(b"x-session-id"),
    }


headers_lists = st.lists(
    st.tuples(
        st.sampled_from(READ + OTHERS),
        st.sampled_from([b"", b"high", b"req-1", b"Bearer sy-a", b"x" * 129, b"a b", b"\xe9"]),
    ),
    max_size=12,
)


@settings(max_examples=400, deadline=None)
@given(headers_lists)
def test_the_caller_holds_what_each_header_means(headers: list[tuple[bytes, bytes]]) -> None:
    expected = _plain(headers)
    try:
        caller = read_caller({"headers": headers})
    except GatewayError as error:
        assert repr(error.body) == expected
        return
    assert isinstance(expected, dict)
    forwarded = dict(caller.forwarded)
    assert forwarded.pop("x-request-id") == caller.request_id  # the gateway's own id, always
    got = {
        "authorization": caller.authorization,
        "client_request_id": caller.client_request_id,
        "forwarded": forwarded,
        "priority": caller.priority,
        "explicit_class": caller.explicit_class,
        "tenant": caller.tenant,
        "session": caller.session,
    }
    assert got == expected
    assert caller.headers is headers
