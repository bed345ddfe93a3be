"""The call-count bench's arithmetic: counts per request, and what changed between two runs."""

from __future__ import annotations

import asyncio

from loadtest.bench.call_counts import InterpreterCounts, _send_sdk, compare, format_table, per_request
from tests.support import RecordingBackend


def test_counts_are_divided_by_the_requests_sent_and_sorted() -> None:
    raw = {"python": {"a.py:1 f": 300, "b.py:9 g": 1000}, "c": {"len": 4000, "dict.get": 200}}
    summary = per_request(raw, 100)
    assert summary["python_frames"] == 13.0 and summary["c_calls"] == 42.0
    assert list(summary["python"].items()) == [("b.py:9 g", 10.0), ("a.py:1 f", 3.0)]
    table = format_table({"mode": "keys", "stream": False, **summary}, top=1)
    assert "13.0 Python frames and 42.0 C calls per request" in table
    assert "b.py:9 g" in table and "a.py:1 f" not in table  # --top 1


def test_a_function_that_moved_is_the_same_function_and_lambdas_add_up() -> None:
    before = per_request({"python": {"m.py:10 f": 200, "m.py:20 h.<locals>.<lambda>": 100}, "c": {}}, 100)
    after = per_request(
        {"python": {"m.py:14 f": 200, "m.py:30 h.<locals>.<lambda>": 50, "m.py:31 h.<locals>.<lambda>": 50},
         "c": {"len": 100}},
        100,
    )  # fmt: skip
    text = compare(before, after, top=10)
    assert "Python frames per request 3.0 -> 3.0, C calls 0.0 -> 1.0" in text
    assert "m.py f" not in text and "<lambda>" not in text  # unchanged once the line numbers go
    assert "+1.00  c: len" in text


def _loop(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def test_the_bytecodes_of_a_loop_grow_with_its_turns_and_calls_are_counted_once_each() -> None:
    counts = InterpreterCounts()
    counts.start()
    _loop(10)
    _loop(10)
    len("abc")
    short = counts.stop()
    counts.start()
    _loop(110)
    long = counts.stop()
    (where,) = [w for w in short["python"] if w.endswith(" _loop")]
    assert short["python"][where] == 2 and long["python"][where] == 1
    assert short["c"]["len"] == 1
    per_turn = (long["bytecodes"][where] - short["bytecodes"][where] / 2) / 100
    assert 4 <= per_turn <= 12  # FOR_ITER, STORE_FAST, LOAD_FASTs, BINARY_OP, JUMP_BACKWARD, ...
    frames = sum(counts.frames.values())
    _loop(5)
    assert sum(counts.frames.values()) == frames  # stopped: nothing more is counted


def test_bytecodes_are_divided_shown_and_compared() -> None:
    raw = {"python": {"a.py:1 f": 100}, "c": {}, "bytecodes": {"a.py:1 f": 5000, "b.py:2 g": 1000}}
    summary = per_request(raw, 100)
    assert summary["bytecodes_total"] == 60.0
    assert list(summary["bytecodes"].items()) == [("a.py:1 f", 50.0), ("b.py:2 g", 10.0)]
    table = format_table({"mode": "keys", "stream": False, **summary}, top=5)
    assert "60 bytecodes" in table and "bytecodes executed, by function" in table
    after = per_request({**raw, "bytecodes": {"a.py:3 f": 3000, "b.py:2 g": 1000}}, 100)
    text = compare(summary, after, top=10)
    assert "bytecodes 60 -> 40" in text and "-20.00  bytecodes: a.py f" in text


def test_the_table_says_which_client_sent_the_requests() -> None:
    summary = per_request({"python": {"a.py:1 f": 100}, "c": {}}, 100)
    assert "from openai," in format_table({"mode": "keys", "stream": False, "client": "openai", **summary}, 5)
    assert "from httpx," in format_table({"mode": "keys", "stream": False, **summary}, 5)


def test_the_sdk_client_sends_every_request_with_the_sdks_own_headers() -> None:
    """`--client openai`: exactly the requests asked for, each carrying what the SDK sends (its
    `x-stainless-*` headers), so the gateway's per-header work is counted as real clients cause it."""
    body = b'{"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}'
    with RecordingBackend("tiny") as backend:
        asyncio.run(_send_sdk(backend.url, "sy-test", body, 21))
    assert len(backend.requests) == 21
    for path, headers, _ in backend.requests:
        sent = {name.lower(): value for name, value in headers.items()}
        assert path == "/v1/chat/completions" and sent["authorization"] == "Bearer sy-test"
        assert "x-stainless-lang" in sent and len(sent) >= 12  # 17 from openai 3.57
