"""SseRelay: events pass through unchanged however the bytes are split; the usage chunk is read."""

from __future__ import annotations

import json

import pytest

from gateway.request.sse import COUNT_AFTER, SseRelay


def _chunk(content: str | None = None, finish: str | None = None, role: str | None = None) -> bytes:
    delta: dict[str, str] = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    data = {
        "id": "chatcmpl-5f1c",
        "object": "chat.completion.chunk",
        "created": 1735000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _usage_chunk(prompt: int, completion: int) -> bytes:
    data = {
        "id": "chatcmpl-5f1c",
        "object": "chat.completion.chunk",
        "created": 1735000000,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
        },
    }
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
BODY_EVENTS = [
    _chunk("", role="assistant"),
    _chunk("Hello"),
    _chunk(" usage"),  # the bare word usage
    _chunk('the "usage" field'),  # JSON-escaped: \"usage\"
    _chunk("usage"),  # a JSON string whose whole value is "usage"
    _chunk("", finish="stop"),
]
USAGE = _usage_chunk(17, 6)
STREAM = b"".join([*BODY_EVENTS, USAGE, DONE])
STREAM_WITHOUT_USAGE = b"".join([*BODY_EVENTS, DONE])


def _relay(pieces: list[bytes], keep: bool) -> tuple[bytes, SseRelay]:
    sse = SseRelay(keep_usage_chunk=keep)
    out = b"".join(sse.feed(p) for p in pieces) + sse.flush()
    return out, sse


def test_recorded_stream_contains_what_the_tests_rely_on():
    assert b'\\"usage\\"' in STREAM
    assert b'"content":"usage"' in STREAM
    assert STREAM.count(b"\n\n") == len(BODY_EVENTS) + 2


@pytest.mark.parametrize("keep", [False, True])
def test_every_single_split_point(keep: bool):
    expected = STREAM if keep else STREAM_WITHOUT_USAGE
    for cut in range(len(STREAM) + 1):
        out, sse = _relay([STREAM[:cut], STREAM[cut:]], keep)
        assert out == expected, f"split at {cut}"
        assert sse.usage is not None and sse.usage.prompt_tokens == 17, f"split at {cut}"
        assert sse.events == len(BODY_EVENTS) + 2, f"split at {cut}"


@pytest.mark.parametrize("keep", [False, True])
def test_every_pair_of_split_points_near_the_usage_chunk_edges(keep: bool):
    expected = STREAM if keep else STREAM_WITHOUT_USAGE
    start = STREAM.index(USAGE)
    end = start + len(USAGE)
    cuts = sorted({*range(start - 8, start + 9), *range(end - 8, end + 9), start + len(USAGE) // 2})
    for a in cuts:
        for b in (c for c in cuts if c >= a):
            out, sse = _relay([STREAM[:a], STREAM[a:b], STREAM[b:]], keep)
            assert out == expected, f"splits at {a}, {b}"
            assert sse.usage is not None and sse.usage.completion_tokens == 6


@pytest.mark.parametrize("keep", [False, True])
@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 10_000])
def test_fixed_size_pieces(keep: bool, size: int):
    pieces = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    out, sse = _relay(pieces, keep)
    assert out == (STREAM if keep else STREAM_WITHOUT_USAGE)
    assert sse.events == len(BODY_EVENTS) + 2


def test_output_only_ever_contains_whole_events():
    sse = SseRelay(keep_usage_chunk=True)
    for i in range(len(STREAM)):
        out = sse.feed(STREAM[i : i + 1])
        assert out == b"" or out.endswith(b"\n\n")


def test_usage_values_captured():
    _, sse = _relay([STREAM], keep=False)
    assert sse.usage is not None
    assert (sse.usage.prompt_tokens, sse.usage.completion_tokens, sse.usage.total_tokens) == (17, 6, 23)


def test_last_usage_chunk_wins():
    # vLLM's usage is cumulative: the last one is the total, never a sum.
    stream = b"".join([_chunk("a"), _usage_chunk(5, 1), _chunk("b"), _usage_chunk(5, 2), DONE])
    out, sse = _relay([stream], keep=False)
    assert sse.usage is not None
    assert (sse.usage.prompt_tokens, sse.usage.completion_tokens) == (5, 2)
    assert out == _chunk("a") + _chunk("b") + DONE


def test_usage_on_a_chunk_with_choices_is_read_but_kept():
    # continuous_usage_stats: every content chunk carries usage; these must reach the client.
    data = json.loads(_chunk("x")[6:])
    data["usage"] = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
    event = b"data: " + json.dumps(data).encode() + b"\n\n"
    out, sse = _relay([event, DONE], keep=False)
    assert out == event + DONE
    assert sse.usage is not None and sse.usage.total_tokens == 4


def test_content_mentioning_usage_is_not_mistaken():
    stream = b"".join([*BODY_EVENTS, DONE])
    out, sse = _relay([stream], keep=False)
    assert out == stream
    assert sse.usage is None


def test_null_usage_on_content_chunks_is_not_captured():
    data = json.loads(_chunk("hi")[6:])
    data["usage"] = None
    event = b"data: " + json.dumps(data).encode() + b"\n\n"
    out, sse = _relay([event], keep=False)
    assert out == event
    assert sse.usage is None


def test_malformed_usage_event_is_relayed_as_is():
    event = b'data: {"choices":[],"usage":{"prompt_tokens":\n\n'
    out, sse = _relay([event, DONE], keep=False)
    assert out == event + DONE
    assert sse.usage is None


def test_trailing_unterminated_event_is_returned_by_flush():
    sse = SseRelay(keep_usage_chunk=False)
    partial = b'data: {"id":"x","choices":[{"delta":{"content":"cut'
    assert sse.feed(_chunk("a") + partial) == _chunk("a")
    assert sse.flush() == partial
    assert sse.flush() == b""
    assert sse.events == 1


def test_nothing_is_emitted_before_an_event_ends():
    sse = SseRelay(keep_usage_chunk=True)
    assert sse.feed(b"data: {") == b""
    assert sse.feed(b'"a":1}\n') == b""
    assert sse.feed(b"\n") == b'data: {"a":1}\n\n'
    assert sse.events == 1


def test_event_counting_includes_done_and_usage():
    sse = SseRelay(keep_usage_chunk=False)
    sse.feed(_chunk("a") + _chunk("b"))
    assert sse.events == 2
    sse.feed(USAGE)
    assert sse.events == 3
    sse.feed(DONE)
    assert sse.events == 4


def test_fresh_relay_state():
    sse = SseRelay(keep_usage_chunk=True)
    assert (sse.usage, sse.events, sse.failed) == (None, 0, None)
    assert sse.flush() == b""


def test_events_are_counted_exactly_while_at_most_count_after_bytes_wait_uncounted() -> None:
    sse = SseRelay(keep_usage_chunk=False)
    block = b"".join(BODY_EVENTS)
    fed = 0
    while fed <= 3 * COUNT_AFTER:
        sse.feed(block)
        fed += len(block)
        assert sse._uncounted_bytes <= COUNT_AFTER
    blocks = fed // len(block)
    assert sse.events == blocks * len(BODY_EVENTS)
    assert sse._uncounted_bytes == 0
