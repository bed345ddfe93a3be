"""The fixed request and answers the client benchmark sends and serves (a ~200-token chat, 64 SSE chunks)."""

from __future__ import annotations

import json
from typing import Any

MODULE = "loadtest.bench.http_clients"
CLIENTS = ("httpx", "aiohttp", "switchyard")
MODES = ("json", "stream")
CHAT_PATH = "/v1/chat/completions"
RESULT_MARK = "BENCHJSON "
STREAM_MARK = b'"stream":true'
MAX_LOADGEN_REQUESTS = 5_000_000
JSON_HEADERS = {"Content-Type": "application/json"}

# --------------------------------------------------------------------------------------------- payloads

_PROMPT = (
    "I am moving a small team's nightly data pipeline from a single large server to a managed cluster and "
    "would like a careful plan. The pipeline reads about forty gigabytes of compressed logs from object "
    "storage, parses them, joins them with a customer table that changes a few times a day, aggregates "
    "per hour and per region, and writes the results to a warehouse that analysts query every morning. "
    "Today it takes about five hours and sometimes fails halfway, which means someone has to restart it "
    "by hand. Please describe how to split the work into stages that can be retried on their own, how to "
    "size the cluster for the first month, what to monitor so that a failure is noticed before the "
    "analysts arrive, and how to test the new setup against the old one for a week without doubling the "
    "cost. Keep the answer short, practical and organised as a numbered list."
)
_ANSWER = (
    "Split the pipeline into extract parse join aggregate and load stages each writing its output to "
    "object storage so any stage can be retried alone start with a small autoscaling cluster and watch "
    "queue depth stage duration and freshness alerts then compare both outputs daily for one week"
)
_WORDS = _ANSWER.split(" ")
_CREATED = 1_732_250_000
_USAGE = {"prompt_tokens": 212, "completion_tokens": 64, "total_tokens": 276}


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def chat_request(stream: bool, model: str = "tiny") -> bytes:
    """The client request body: ~200 prompt tokens, max_tokens 64, optionally streaming with usage."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "system", "content": "You are a helpful engineering assistant."},
            {"role": "user", "content": _PROMPT},
        ],
        "max_tokens": 64,
        "temperature": 0.7,
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return _dumps(body)


def _completion_words(n: int) -> list[str]:
    return (_WORDS * (n // len(_WORDS) + 1))[:n]


def completion_body(model: str = "tiny") -> bytes:
    """Upstream's fixed non-streaming answer (chat.completion with usage)."""
    return _dumps(
        {
            "id": "chatcmpl-bench0000000000000000000000000001",
            "object": "chat.completion",
            "created": _CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": " ".join(_completion_words(64))},
                    "logprobs": None,
                    "finish_reason": "length",
                }
            ],
            "usage": _USAGE,
        }
    )


def _chunk(delta: dict[str, Any] | None, finish: str | None, usage: bool, model: str) -> bytes:
    event: dict[str, Any] = {
        "id": "chatcmpl-bench0000000000000000000000000002",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
        "choices": [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    if usage:
        event["usage"] = _USAGE
    return b"data: " + _dumps(event) + b"\n\n"


def sse_body(n_chunks: int = 64, model: str = "tiny") -> bytes:
    """Upstream's streamed answer: n content chunks, a usage chunk, ``data: [DONE]``."""
    parts = []
    for i, word in enumerate(_completion_words(n_chunks)):
        delta = {"role": "assistant", "content": word} if i == 0 else {"content": " " + word}
        parts.append(_chunk(delta, "length" if i == n_chunks - 1 else None, False, model))
    parts.append(_chunk(None, None, True, model))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def check_response(mode: str, status: int, body: bytes) -> None:
    """Raise unless ``body`` is a complete answer of ``mode`` (used once per proxy and mode)."""
    if status != 200:
        raise RuntimeError(f"{mode}: status {status}: {body[:300]!r}")
    if mode == "json":
        if json.loads(body).get("usage", {}).get("total_tokens") != _USAGE["total_tokens"]:
            raise RuntimeError(f"json: no usage in {body[:300]!r}")
        return
    events = [line[6:] for line in body.split(b"\n") if line.startswith(b"data: ")]
    if len(events) != 66 or events[-1] != b"[DONE]" or b'"usage"' not in events[-2]:
        raise RuntimeError(f"stream: {len(events)} events, tail {body[-200:]!r}")
