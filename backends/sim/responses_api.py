"""The OpenAI Responses API over the simulator's chat generation, in the shape vLLM 0.32 answers it
(recorded from a real server: tests/vllm/fixtures/responses*). A request becomes a chat request
(`responses_to_chat`), is generated like any other, and `ResponsesShape` renders its body or its typed
events. Like vLLM by default, the simulator stores no response: `previous_response_id` and
`GET /v1/responses/{id}` answer 404.
"""

from __future__ import annotations

import os
import time
from typing import Any

import msgspec

from backends.sim.protocol import SimError
from backends.sim.text import Generation

_encode = msgspec.json.encode


def content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict):
                raise SimError(400, f"`{param}` parts must be objects", param=param)
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
            elif part.get("type") in ("tool_result", "function_call_output") and "content" in part:
                texts.append(content_text(part["content"], param))
        return " ".join(texts)
    raise SimError(400, f"`{param}` must be a string or a list of content parts", param=param)


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    if body.get("previous_response_id") is not None:
        raise not_found_response(body["previous_response_id"])
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise SimError(400, "`instructions` must be a string", param="instructions")
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for item in given:
            messages.append(_response_item(item))
    else:
        raise SimError(400, "`input` must be a string or a non-empty list of items", param="input")
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for source, target in (
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("seed", "seed"),
    ):
        if body.get(source) is not None:
            chat[target] = body[source]
    tools = body.get("tools")
    if tools:
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise SimError(400, "`tools` must be a list of objects", param="tools")
        chat["tools"] = [
            {"type": "function", "function": {"name": t.get("name"), "parameters": t.get("parameters")}}
            for t in tools
            if t.get("type") == "function"
        ]
        choice = body.get("tool_choice")
        if isinstance(choice, dict) and choice.get("type") == "function":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        elif choice is not None:
            chat["tool_choice"] = choice
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema")}}
    elif isinstance(fmt, dict) and fmt.get("type") == "json_object":
        chat["response_format"] = {"type": "json_object"}
    return chat


def _response_item(item: Any) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise SimError(400, "each `input` item must be an object", param="input")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise SimError(400, "an input message needs a `role`", param="input")
        return {
            "role": "system" if role == "developer" else role,
            "content": content_text(item.get("content"), "input"),
        }
    if kind == "function_call":
        return {"role": "assistant", "content": f"{item.get('name')}({item.get('arguments')})"}
    if kind == "function_call_output":
        return {"role": "user", "content": content_text(item.get("output", ""), "input")}
    raise SimError(400, f"unsupported input item type `{kind}`", param="input")


def not_found_response(response_id: Any) -> SimError:
    error = SimError(404, f"Response with id '{response_id}' not found.", param="response_id")
    error.type = "invalid_request_error"
    return error


class ResponsesShape:
    """One Responses API answer: its body, or its events (each with a `sequence_number`)."""

    def __init__(self, body: dict[str, Any], model: str, prompt_tokens: int) -> None:
        self.id = f"resp_{os.urandom(8).hex()}"
        self.item_id = f"msg_{os.urandom(8).hex()}"
        self.created = int(time.time())
        self.request = body
        self.model = model
        self.prompt_tokens = prompt_tokens
        self._sequence = 0

    def body(self, generation: Generation | None, status: str = "completed") -> dict[str, Any]:
        body = self.request
        done = generation is not None
        incomplete = (
            generation is not None and generation.finish_reason == "length" and generation.tool_call is None
        )
        output_tokens = len(generation.tokens) if generation is not None else 0
        tools = body.get("tools") if isinstance(body.get("tools"), list) else []
        return {
            "id": self.id,
            "created_at": self.created,
            "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
            "instructions": body.get("instructions"),
            "metadata": body.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": [self.item(generation)] if generation is not None else [],
            "parallel_tool_calls": True,
            "temperature": float(body.get("temperature", 1.0)),
            "tool_choice": body.get("tool_choice", "auto" if tools else "none"),
            "tools": tools,
            "top_p": float(body.get("top_p", 1.0)),
            "background": False,
            "max_output_tokens": body.get("max_output_tokens"),
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": ("incomplete" if incomplete else "completed") if done else status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": self.usage(output_tokens) if done else None,
            "user": None,
        }

    def usage(self, output_tokens: int) -> dict[str, Any]:
        return {
            "input_tokens": self.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": self.prompt_tokens + output_tokens,
        }

    def item(self, generation: Generation | None, in_progress: bool = False) -> dict[str, Any]:
        status = "in_progress" if in_progress else "completed"
        if generation is not None and generation.tool_call is not None:
            call_id, name, arguments = generation.tool_call
            return {
                "id": f"fc_{self.item_id[4:]}",
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": "" if in_progress else arguments,
                "status": status,
            }
        content = [] if in_progress or generation is None else [self.part(generation.text)]
        return {
            "id": self.item_id,
            "content": content,
            "role": "assistant",
            "status": status,
            "type": "message",
        }

    @staticmethod
    def part(text: str) -> dict[str, Any]:
        return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}

    def event(self, kind: str, **data: Any) -> bytes:
        data["sequence_number"] = self._sequence
        data["type"] = kind
        self._sequence += 1
        return b"event: %s\ndata: %s\n\n" % (kind.encode(), _encode(data))

    def opening(self, generation: Generation) -> bytes:
        started = self.body(None, status="in_progress")
        frames = [
            self.event("response.created", response=started),
            self.event("response.in_progress", response=started),
            self.event("response.output_item.added", item=self.item(generation, True), output_index=0),
        ]
        if generation.tool_call is None:
            frames.append(
                self.event(
                    "response.content_part.added",
                    content_index=0,
                    item_id=self.item_id,
                    output_index=0,
                    part={**self.part(""), "logprobs": []},
                )
            )
        return b"".join(frames)

    def delta(self, generation: Generation, token: str) -> bytes:
        if not token:
            return b""
        if generation.tool_call is not None:
            return self.event(
                "response.function_call_arguments.delta", delta=token, item_id=self.item(generation)["id"],
                output_index=0,
            )  # fmt: skip
        return self.event(
            "response.output_text.delta",
            content_index=0,
            delta=token,
            item_id=self.item_id,
            logprobs=[],
            output_index=0,
        )

    def closing(self, generation: Generation) -> bytes:
        frames = []
        if generation.tool_call is None:
            text = generation.text
            frames.append(
                self.event(
                    "response.output_text.done",
                    content_index=0,
                    item_id=self.item_id,
                    logprobs=[],
                    output_index=0,
                    text=text,
                )
            )
            frames.append(
                self.event(
                    "response.content_part.done",
                    content_index=0,
                    item_id=self.item_id,
                    output_index=0,
                    part=self.part(text),
                )
            )
        else:
            item = self.item(generation)
            frames.append(
                self.event(
                    "response.function_call_arguments.done",
                    arguments=item["arguments"],
                    item_id=item["id"],
                    output_index=0,
                )
            )
        frames.append(self.event("response.output_item.done", item=self.item(generation), output_index=0))
        frames.append(self.event("response.completed", response=self.body(generation)))
        return b"".join(frames)
