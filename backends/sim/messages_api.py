"""Anthropic's Messages API over the simulator's chat generation, in the shape vLLM 0.32 answers it
(recorded from a real server: tests/vllm/fixtures/messages*), errors in Anthropic's envelope."""

from __future__ import annotations

import os
from typing import Any

import msgspec

from backends.sim.protocol import SimError
from backends.sim.responses_api import content_text
from backends.sim.text import Generation

_encode = msgspec.json.encode


class AnthropicError(SimError):
    """vLLM answers /v1/messages errors in Anthropic's envelope, with its own error type names."""

    def body(self) -> dict[str, Any]:
        return {"type": "error", "error": {"type": self.type, "message": self.message}}


def anthropic(error: SimError) -> AnthropicError:
    return AnthropicError(error.status, error.message, error.param, error.type)


def messages_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("max_tokens") is None:
        raise AnthropicError(400, "`max_tokens` is required", param="max_tokens")
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        raise AnthropicError(400, "`messages` must be a non-empty list", param="messages")
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": content_text(system, "system")})
    for message in given:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise AnthropicError(400, "each message needs a `role` of user or assistant", param="messages")
        messages.append(
            {"role": message["role"], "content": content_text(message.get("content"), "messages")}
        )
    chat: dict[str, Any] = {
        "model": body.get("model"),
        "messages": messages,
        "max_tokens": body["max_tokens"],
    }
    for name in ("temperature", "top_p", "stream"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if body.get("stop_sequences") is not None:
        chat["stop"] = body["stop_sequences"]
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise AnthropicError(400, "`tools` must be a list of objects", param="tools")
        chat["tools"] = [
            {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("input_schema")}}
            for t in tools
        ]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            kind = choice.get("type")
            if kind == "any":
                chat["tool_choice"] = "required"
            elif kind == "tool":
                chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
            elif kind == "none":
                chat["tool_choice"] = "none"
    return chat


class MessagesShape:
    def __init__(self, model: str, prompt_tokens: int) -> None:
        self.id = f"chatcmpl-{os.urandom(8).hex()}"
        self.model = model
        self.prompt_tokens = prompt_tokens

    @staticmethod
    def stop_reason(generation: Generation) -> str:
        if generation.tool_call is not None and generation.finish_reason == "stop":
            return "tool_use"
        if generation.finish_reason == "length":
            return "max_tokens"
        return "stop_sequence" if generation.stop_reason is not None else "end_turn"

    @staticmethod
    def block(generation: Generation) -> dict[str, Any]:
        if generation.tool_call is not None:
            call_id, name, arguments = generation.tool_call
            return {
                "type": "tool_use",
                "id": f"toolu_{call_id[-24:]}",
                "name": name,
                "input": msgspec.json.decode(arguments),
            }
        return {"type": "text", "text": generation.text}

    def body(self, generation: Generation) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [self.block(generation)],
            "model": self.model,
            "stop_reason": self.stop_reason(generation),
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": len(generation.tokens)},
        }
        if generation.stop_reason is not None:  # vLLM leaves the key out otherwise
            body["stop_sequence"] = generation.stop_reason
        return body

    @staticmethod
    def event(kind: str, **data: Any) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), _encode({"type": kind, **data}))

    def opening(self, generation: Generation) -> bytes:
        message = {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.prompt_tokens, "output_tokens": 0},
        }
        block = self.block(generation)
        start = {"type": "text", "text": ""} if block["type"] == "text" else {**block, "input": {}}
        return self.event("message_start", message=message) + self.event(
            "content_block_start", content_block=start, index=0
        )

    def delta(self, generation: Generation, token: str) -> bytes:
        if not token:
            return b""
        if generation.tool_call is not None:
            return self.event(
                "content_block_delta", delta={"type": "input_json_delta", "partial_json": token}, index=0
            )
        return self.event("content_block_delta", delta={"type": "text_delta", "text": token}, index=0)

    def closing(self, generation: Generation) -> bytes:
        usage = {"input_tokens": self.prompt_tokens, "output_tokens": len(generation.tokens)}
        return b"".join(
            (
                self.event("content_block_stop", index=0),
                self.event(
                    "message_delta",
                    delta={
                        "stop_reason": self.stop_reason(generation),
                        "stop_sequence": generation.stop_reason,
                    },
                    usage=usage,
                ),
                self.event("message_stop"),
            )
        )
