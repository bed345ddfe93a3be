"""TypedSseRelay on streams recorded from vLLM 0.32 (tests/unit/gateway/data): events pass through
unchanged however the bytes are split, usage is read as each API places it, errors end in each API's shape."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.openai.errors import upstream_failed
from gateway.openai.responses import Usage
from gateway.request.typed_sse import TypedSseRelay, typed_usage

DATA = Path(__file__).parent / "data"
MESSAGES = (DATA / "vllm_messages_stream.sse").read_bytes()
RESPONSES = (DATA / "vllm_responses_stream.sse").read_bytes()


def relay_all(relay: TypedSseRelay, stream: bytes, size: int) -> bytes:
    out = b"".join(relay.feed(stream[i : i + size]) for i in range(0, len(stream), size))
    return out + relay.flush()


@pytest.mark.parametrize("size", [1, 7, 64, 100_000])
def test_messages_usage_is_input_from_message_start_and_output_from_message_delta(size: int) -> None:
    relay = TypedSseRelay("messages")
    assert relay_all(relay, MESSAGES, size) == MESSAGES
    assert relay.usage == Usage(10, 3, 13)
    assert relay.final_response is None


def test_messages_delta_without_input_tokens_keeps_message_starts() -> None:
    # Anthropic's own message_delta carries only output_tokens.
    stream = MESSAGES.replace(
        b'"usage":{"input_tokens":10,"output_tokens":3}', b'"usage":{"output_tokens":3}'
    )
    relay = TypedSseRelay("messages")
    relay_all(relay, stream, 50)
    assert relay.usage == Usage(10, 3, 13)


@pytest.mark.parametrize("size", [1, 13, 100_000])
def test_responses_usage_and_final_response_come_from_response_completed(size: int) -> None:
    relay = TypedSseRelay("responses")
    assert relay_all(relay, RESPONSES, size) == RESPONSES
    assert relay.usage == Usage(10, 3, 13)
    assert relay.final_response is not None
    final = json.loads(relay.final_response)
    assert final["id"] == "resp_b0ea5e2a9e9ced8f" and final["output"][0]["content"][0]["text"] == "UNIhttpUNI"


def test_a_stream_cut_before_its_usage_has_none_and_counts_its_deltas() -> None:
    relay = TypedSseRelay("responses")
    cut = RESPONSES[: RESPONSES.index(b"event: response.output_text.done")]
    relay_all(relay, cut, 100)
    assert relay.usage is None and relay.final_response is None
    assert relay.events - 1 == 2  # two text deltas: the estimate of generated tokens


def test_error_events_are_in_each_apis_shape() -> None:
    error = upstream_failed("b1", "stream broke")
    messages = TypedSseRelay("messages").error_event(error)
    assert messages.startswith(b"event: error\ndata: ") and messages.endswith(b"\n\n")
    body = json.loads(messages.split(b"data: ", 1)[1])
    assert body == {"type": "error", "error": {"type": "api_error", "message": error.body.message}}
    responses = TypedSseRelay("responses").error_event(error)
    event = json.loads(responses.split(b"data: ", 1)[1])
    assert event["type"] == "error" and event["code"] == "upstream_failed" and event["message"]


def test_whole_answers_usage() -> None:
    assert typed_usage(b'{"usage": {"input_tokens": 4, "output_tokens": 2}}') == Usage(4, 2, 6)
    assert typed_usage(b'{"usage": {"prompt_tokens": 4, "completion_tokens": 2}}') is None
    assert typed_usage(b"not json") is None
