"""A cut /v1/completions stream is counted token for token: it has no role chunk to discount."""

from __future__ import annotations

import json

from backends.models import Backend, Pool
from gateway.ledger.memory import InMemoryLedger
from gateway.request.account import Served, account
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse
from gateway.request.sse import SseRelay

POOL = Pool(
    name="p", vendor="amd", accelerator="mi300x", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)
BACKEND = Backend(
    name="b-0", url="http://127.0.0.1:1", models=frozenset({"m"}), max_model_len=4096, pool=POOL
)


def _event(data: dict[str, object]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


def _completion_chunk(text: str) -> bytes:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": None}
    return _event(
        {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "choices": [choice]}
    )


def _chat_chunk(delta: dict[str, str]) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
    return _event(
        {"id": "c-1", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [choice]}
    )


def _billed(endpoint: str, body: bytes, events: list[bytes], split: int) -> int:
    sse = SseRelay(keep_usage_chunk=False)
    stream = b"".join(events)
    sse.feed(stream[:split])
    sse.feed(stream[split:])
    parsed = parse(endpoint, body)  # type: ignore[arg-type]
    served = Served(
        backend=BACKEND,
        concurrency=1,
        status=200,
        usage=sse.usage,
        completion_events=sse.events,
        started_at=1.0,
        first_byte_at=1.1,
        ended_at=2.0,
    )
    caller = Caller("r", None, {})
    record = account(InMemoryLedger(), caller, parsed, classify(parsed, caller), "x", served)
    return record.completion_tokens


def test_a_cut_completions_stream_bills_every_token_received() -> None:
    events = [_completion_chunk(f"t{i}") for i in range(11)]
    body = b'{"model":"m","prompt":"hi","stream":true}'
    for split in (0, 5, 200, len(b"".join(events))):
        assert _billed("completions", body, events, split) == 11


def test_a_cut_chat_stream_still_discounts_its_role_chunk() -> None:
    events = [_chat_chunk({"role": "assistant", "content": ""})] + [_chat_chunk({"content": "t"})] * 10
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'
    for split in (0, 5, 200):
        assert _billed("chat", body, events, split) == 10
