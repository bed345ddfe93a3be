"""The SSE frames of a chat or completions stream, as vLLM sends them (see StreamFrames)."""

from __future__ import annotations

from typing import Any

import msgspec

from backends.sim.output import completion_logprobs
from backends.sim.protocol import Kind, chat_logprobs
from backends.sim.text import Generation


def chunk_object(kind: Kind) -> str:
    return "chat.completion.chunk" if kind == "chat" else "text_completion"


class StreamFrames:
    """The SSE frames of one stream, assembled from bytes encoded once per request.

    Per token only the token text is JSON-encoded; everything else is a constant fragment. The frames
    carry the keys vLLM sends (in vLLM's order): the chat role chunk has top-level `prompt_token_ids` and
    `prompt_text`; every token choice has `token_ids` (completions also `stop_reason` and
    `prompt_token_ids`); the last chunk of the stream (the usage chunk, or the last token chunk without
    `include_usage`) carries `system_fingerprint`.
    """

    __slots__ = ("_fingerprint", "_fingerprint_value", "_heads", "_kind", "_meta")

    def __init__(
        self, kind: Kind, request_id: str, created: int, model: str, n: int, fingerprint: str
    ) -> None:
        head = b'data: {"id":%s,"object":%s,"created":%d,"model":%s,"choices":[{"index":' % (
            _encode(request_id),
            _encode(chunk_object(kind)),
            created,
            _encode(model),
        )
        self._heads = [head + str(index).encode() for index in range(n)]
        self._kind = kind
        self._fingerprint = b',"system_fingerprint":' + _encode(fingerprint)
        self._fingerprint_value = fingerprint
        self._meta = {"id": request_id, "object": chunk_object(kind), "created": created, "model": model}

    def role(self, index: int) -> bytes:
        return self._heads[index] + _ROLE_TAIL

    def token(self, index: int, text: str, finish_reason: str | None, last: bool = False) -> bytes:
        """A token of choice `index`; `finish_reason` on its last token, `last` on the stream's last chunk."""
        chat = self._kind == "chat"
        if finish_reason is None:
            if chat:
                return b"%s%s%s%s" % (self._heads[index], _CHAT_DELTA, _encode(text), _CHAT_TAIL)
            return b"%s%s%s%s" % (self._heads[index], _TEXT, _encode(text), _TEXT_TAIL)
        return b"%s%s%s%s%s%s%s" % (
            self._heads[index],
            _CHAT_DELTA if chat else _TEXT,
            _encode(text),
            _CHAT_FINISH if chat else _TEXT_FINISH,
            _encode(finish_reason),
            _CHAT_FINISH_TAIL if chat else _TEXT_FINISH_TAIL,
            self._fingerprint + _CLOSE if last else _CLOSE,
        )

    def shaped(self, index: int, generation: Generation, step: int, top: int | None, last: bool) -> bytes:
        """Token `step` of a choice off the fast path (log probabilities or a tool call), built as a dict."""
        token = generation.tokens[step]
        finished = step == len(generation.tokens) - 1
        choice: dict[str, Any] = {"index": index}
        if self._kind == "chat":
            call = generation.tool_call
            if call is None:
                choice["delta"] = {"content": token}
            elif token:
                choice["delta"] = {"tool_calls": [{"index": 0, "function": {"arguments": token}}]}
            else:
                choice["delta"] = {}
            choice["logprobs"] = None if top is None else chat_logprobs([token], top, step)
        else:
            choice["text"] = token
            choice["logprobs"] = None if top is None else completion_logprobs([token], top, step)
        choice["finish_reason"] = generation.api_finish_reason if finished else None
        if finished:
            choice["stop_reason"] = generation.stop_reason
        chunk: dict[str, Any] = {**self._meta, "choices": [choice]}
        if last:
            chunk["system_fingerprint"] = self._fingerprint_value
        frame = b"data: " + _encode(chunk) + b"\n\n"
        if step == 0 and generation.tool_call is not None:
            call_id, name, _ = generation.tool_call
            header = {
                "id": call_id,
                "type": "function",
                "index": 0,
                "function": {"name": name, "arguments": ""},
            }
            opening = {**self._meta, "choices": [{"index": index, "delta": {"tool_calls": [header]}}]}
            frame = b"data: " + _encode(opening) + b"\n\n" + frame
        return frame

    def usage(self, request_id: str, created: int, model: str, usage_: dict[str, Any]) -> bytes:
        chunk = {
            "id": request_id,
            "object": chunk_object(self._kind),
            "created": created,
            "model": model,
            "choices": [],
            "usage": usage_,
        }
        return b"data: " + _encode(chunk)[:-1] + self._fingerprint + _CLOSE


_encode = msgspec.json.encode
_CLOSE = b"}\n\n"
_ROLE_TAIL = (
    b',"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],'
    b'"prompt_token_ids":null,"prompt_text":null}\n\n'
)
_CHAT_DELTA = b',"delta":{"content":'
_CHAT_TAIL = b'},"logprobs":null,"finish_reason":null,"token_ids":null}]}\n\n'
_TEXT = b',"text":'
_CHAT_FINISH = b'},"logprobs":null,"finish_reason":'
_TEXT_FINISH = b',"logprobs":null,"finish_reason":'
_CHAT_FINISH_TAIL = b',"stop_reason":null,"token_ids":null}]'
_TEXT_FINISH_TAIL = b',"stop_reason":null,"prompt_token_ids":null,"token_ids":null}]'
_TEXT_TAIL = b',"logprobs":null,"finish_reason":null' + _TEXT_FINISH_TAIL + _CLOSE
