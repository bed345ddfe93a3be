"""An API key's hints capped where the profile is built: the policy sees only what the key may give."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.http.routes import read_caller
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse
from gateway.tenants.admission import Tenant
from gateway.tenants.keys import PRIORITY_RANK, KeyRecord
from policies.config import parse_policy
from policies.engine import PolicyEngine, load_engine
from policies.presets import resolve

BALANCED = load_engine(resolve("balanced"), [])
TIERED = PolicyEngine(
    parse_policy(
        """
name: tiered
headers:
  x-request-priority: {high: interactive, low: batch}
classes:
  - name: gold
    when: {headers: {x-tier: gold}}
  - name: interactive
    when: {any: [{priority: high}, {headers: {X-Fast: "yes"}}]}
  - name: batch
    when: {priority: [low, batch]}
routes:
  gold: {prefer: any}
  interactive: {prefer: any}
  batch: {prefer: any}
  default: {prefer: any}
""",
        "<tiered>",
    ),
    [],
)


def _decide(
    engine: PolicyEngine,
    headers: list[tuple[str, str]],
    key: KeyRecord | None = None,
    **body: Any,
) -> tuple[str, str | None, list[str]]:
    """(class, priority, hints ignored) of a chat request with these headers, sent with `key`."""
    scope = {"headers": [(n.lower().encode("latin-1"), v.encode("latin-1")) for n, v in headers]}
    caller = read_caller(scope)
    if key is not None:
        caller.key = Tenant(key, None, False)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **body}
    parsed = parse("chat", json.dumps(payload).encode())
    profile = classify(parsed, caller, hints=engine.hints, class_of=engine.classify)
    return engine.classify(profile)[0], profile.priority, caller.hints_ignored or []


def _key(**fields: Any) -> KeyRecord:
    return KeyRecord(id="key_test", **fields)


LOW_BATCH = _key(max_priority="low", classes=["batch"])


def test_a_priority_above_the_key_does_not_reach_the_policys_header_mapping() -> None:
    # Issue 33: classed `interactive` (balanced maps x-switchyard-priority: high) while saying it ignored it.
    cls, priority, ignored = _decide(BALANCED, [("x-switchyard-priority", "high")], LOW_BATCH)
    assert (cls, priority, ignored) == ("batch", "low", ["priority"])


def test_another_header_naming_a_class_the_key_may_not_use_is_ignored_and_said() -> None:
    # Issue 33: `x-request-priority: high` gave `interactive`, and nothing was reported.
    cls, priority, ignored = _decide(BALANCED, [("x-request-priority", "high")], LOW_BATCH)
    assert (cls, priority, ignored) == ("batch", "low", ["x-request-priority"])


def test_open_mode_reads_every_hint_as_before() -> None:
    assert _decide(BALANCED, [("x-request-priority", "high")])[0] == "interactive"
    assert _decide(BALANCED, [("x-switchyard-priority", "high")])[:2] == ("interactive", "high")
    assert _decide(TIERED, [("x-tier", "gold")])[0] == "gold"


def test_hints_the_key_may_give_are_honoured() -> None:
    anything = _key(max_priority="high")
    assert _decide(BALANCED, [("x-request-priority", "high")], anything) == ("interactive", None, [])
    assert _decide(BALANCED, [("x-switchyard-priority", "high")], anything) == ("interactive", "high", [])
    batch_only = _key(classes=["batch"])
    assert _decide(BALANCED, [("x-request-priority", "low")], batch_only) == ("batch", None, [])
    assert _decide(BALANCED, [("x-switchyard-class", "batch")], batch_only) == ("batch", None, [])


def test_a_rules_header_is_a_hint_too() -> None:
    assert _decide(TIERED, [("x-tier", "gold")], _key(classes=["gold"]))[0] == "gold"
    cls, _, ignored = _decide(TIERED, [("x-tier", "gold"), ("x-fast", "yes")], _key(classes=["batch"]))
    assert cls == "default" and ignored == ["x-tier", "x-fast"]
    assert _decide(TIERED, [("x-tier", "silver")], _key(classes=["batch"]))[2] == []  # read, but no class


def test_a_priority_the_key_may_give_does_not_lead_rules_to_a_class_it_may_not_use() -> None:
    high_batch = _key(max_priority="high", classes=["batch"])
    cls, priority, ignored = _decide(TIERED, [("x-switchyard-priority", "high")], high_batch)
    assert (cls, priority, ignored) == ("default", None, ["priority"])
    cls, priority, ignored = _decide(TIERED, [], high_batch, metadata={"priority": "high"})
    assert (cls, priority, ignored) == ("default", None, ["priority"])


def test_the_body_and_unranked_values_are_capped_too() -> None:
    low = _key(max_priority="low")
    assert _decide(BALANCED, [], low, metadata={"priority": "high"})[1:] == ("low", ["priority"])
    normal = _key()
    cls, priority, ignored = _decide(BALANCED, [("x-switchyard-priority", "HIGH")], normal)
    assert (cls, priority, ignored) == ("default", None, ["priority"])


def test_a_second_priority_header_cannot_slip_past() -> None:
    headers = [("x-switchyard-priority", "high"), ("x-switchyard-priority", "low")]
    cls, priority, ignored = _decide(BALANCED, headers, _key(max_priority="low"))
    assert cls == "batch" and priority == "low" and ignored == ["priority"]


_CLASSES = ["interactive", "long-context", "batch", "default", "gold"]
_HEADER_NAMES = ["x-switchyard-priority", "x-switchyard-class", "x-request-priority", "priority", "x-tier",
                 "x-fast", "x-other"]  # fmt: skip
_VALUES = ["high", "HIGH", "normal", "low", "batch", "u=6", "u=1, i", "gold", "yes", "interactive",
           "long-context", "default", "", "urgent"]  # fmt: skip

_keys = st.builds(
    _key,
    max_priority=st.sampled_from(["high", "normal", "low"]),
    classes=st.lists(st.sampled_from(_CLASSES), max_size=3, unique=True),
)
_headers = st.lists(st.tuples(st.sampled_from(_HEADER_NAMES), st.sampled_from(_VALUES)), max_size=5)
_bodies = st.fixed_dictionaries(
    {},
    optional={
        "metadata": st.fixed_dictionaries({"priority": st.sampled_from(_VALUES)}),
        "stream": st.booleans(),
        "n": st.integers(1, 3),
        "max_tokens": st.sampled_from([8, 300, 4000]),
    },
)


@settings(max_examples=400, deadline=None)
@given(
    engine=st.sampled_from([BALANCED, TIERED]), key=_keys, headers=_headers, body=_bodies
)  # fmt: skip
def test_decided_class_and_priority_never_exceed_the_keys_allowance(
    engine: PolicyEngine, key: KeyRecord, headers: list[tuple[str, str]], body: dict[str, Any]
) -> None:
    cls, priority, ignored = _decide(engine, headers, key, **body)
    ceiling = PRIORITY_RANK[key.max_priority]
    if ceiling > 0:
        assert priority is None or priority in PRIORITY_RANK, priority
        assert PRIORITY_RANK[priority or "normal"] >= ceiling
    if key.classes and cls not in key.classes:
        # Only the request itself (its size, stream, n) put it there, never a hint.
        bare = {k: v for k, v in body.items() if k != "metadata"}
        assert cls == _decide(engine, [], key, **bare)[0]
    for name, _ in headers:
        if name in ("x-switchyard-priority", "x-switchyard-class"):
            continue
        given_ = [(n, v) for n, v in headers if n == name]
        kept = [(n, v) for n, v in _kept_headers(engine, headers, key, body) if n == name]
        if kept != given_:
            assert name in ignored


def _kept_headers(
    engine: PolicyEngine, headers: list[tuple[str, str]], key: KeyRecord, body: dict[str, Any]
) -> list[tuple[str, str]]:
    scope = {"headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]}
    caller = read_caller(scope)
    caller.key = Tenant(key, None, False)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, **body}
    parsed = parse("chat", json.dumps(payload).encode())
    profile = classify(parsed, caller, hints=engine.hints, class_of=engine.classify)
    return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in profile.headers or []]


def test_callers_without_a_key_keep_their_headers_list() -> None:
    """Open mode: the profile holds the caller's own headers list (nothing copied per request)."""
    caller = Caller("req-1", None, {}, headers=[(b"x-request-priority", b"high")])
    parsed = parse("chat", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    assert classify(parsed, caller, hints=BALANCED.hints).headers is caller.headers


SDK_HEADERS = [
    ("host", "gw"),
    ("accept-encoding", "gzip, deflate"),
    ("connection", "keep-alive"),
    ("accept", "application/json"),
    ("content-type", "application/json"),
    ("user-agent", "AsyncOpenAI/Python 2.0.0"),
    ("x-stainless-lang", "python"),
    ("x-stainless-package-version", "2.0.0"),
    ("x-stainless-os", "Linux"),
    ("x-stainless-arch", "x64"),
    ("x-stainless-runtime", "CPython"),
    ("x-stainless-runtime-version", "3.11.7"),
    ("x-stainless-async", "async:asyncio"),
    ("authorization", "Bearer sy-x"),
    ("x-stainless-retry-count", "0"),
    ("content-length", "120"),
]
"""What the official SDK sends (the hint paths test one header alone; real requests carry these)."""


def test_hints_among_an_sdks_headers_are_capped_and_the_rest_kept_as_sent() -> None:
    cls, priority, ignored = _decide(
        BALANCED, [*SDK_HEADERS[:9], ("x-request-priority", "high"), *SDK_HEADERS[9:]], LOW_BATCH
    )
    assert (cls, priority, ignored) == ("batch", "low", ["x-request-priority"])
    gold = [*SDK_HEADERS, ("x-tier", "gold")]
    assert _kept_headers(TIERED, gold, _key(classes=["batch"]), {}) == SDK_HEADERS
    assert _decide(TIERED, gold, _key(classes=["gold"]))[0] == "gold"


def test_a_keys_request_without_hints_keeps_its_headers_list() -> None:
    """The usual request with a key: nothing to drop, so nothing is copied."""
    caller = Caller("req-1", None, {}, headers=[(n.encode(), v.encode()) for n, v in SDK_HEADERS])
    caller.key = Tenant(LOW_BATCH, None, False)
    parsed = parse("chat", b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}')
    profile = classify(parsed, caller, hints=TIERED.hints, class_of=TIERED.classify)
    assert profile.headers is caller.headers and not caller.hints_ignored
