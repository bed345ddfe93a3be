"""vLLM's OpenAI wire format for the simulator: request parsing, error bodies and response shapes.

Errors use the shape current vLLM returns (`ErrorResponse` in vllm/entrypoints/openai/engine/protocol.py):
`{"error": {"message": ..., "type": ..., "param": ..., "code": <http status>}}`.
"""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal

from backends.sim.output import (
    PLAIN,
    OutputError,
    OutputSpec,
    chat_token_logprobs,
    completion_logprobs,
    parse_output,
)
from backends.sim.text import Generation, chat_prompt_tokens, count_tokens

Kind = Literal["chat", "completion"]


class SimError(Exception):
    """A request the simulator refuses, answered with vLLM's error body."""

    def __init__(self, status: int, message: str, param: str | None = None, type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.type = type_ or error_type(status)

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.status}
        }


class UnparseableBody(SimError):
    """A body that is not valid UTF-8 JSON (or nests past the parser's limit): vLLM's FastAPI app answers
    these itself, before any handler, with its own 400 shape (checked against real vLLM in tests/vllm)."""

    MESSAGE = "There was an error parsing the body"

    def __init__(self) -> None:
        super().__init__(400, self.MESSAGE)

    def body(self) -> dict[str, Any]:
        return {"detail": self.MESSAGE}


def error_type(status: int) -> str:
    """vLLM-style error type from the status: 400 -> BadRequestError, 500 -> InternalServerError."""
    try:
        name = HTTPStatus(status).phrase.replace(" ", "").replace("-", "")
    except ValueError:
        name = "Unknown"
    return name if name.endswith("Error") else f"{name}Error"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt_key: str
    prompt_tokens: int
    n: int
    max_tokens: int | None
    sampling_key: str | None  # None means greedy: output does not depend on seed or choice index
    stream: bool
    include_usage: bool
    prompts: tuple[tuple[str, int], ...] = ()
    """Each prompt's key and tokens (a completions request may send several); empty: the one above."""
    output: OutputSpec = PLAIN

    def each_prompt(self) -> tuple[tuple[str, int], ...]:
        return self.prompts or ((self.prompt_key, self.prompt_tokens),)


def resolve_model(body: dict[str, Any], models: tuple[str, ...]) -> str:
    model = body.get("model")
    if model is None or model == "":
        return models[0]
    if not isinstance(model, str) or model not in models:
        raise SimError(404, f"The model `{model}` does not exist.", param="model")
    return model


def _optional_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise SimError(400, f"`{name}` must be an integer", param=name)
    if value < minimum:
        raise SimError(400, f"`{name}` must be at least {minimum}, got {value}.", param=name)
    return value


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise SimError(400, "message content must be a string or a list of parts", param="messages")


def _chat_prompt(body: dict[str, Any]) -> tuple[str, int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise SimError(400, "`messages` is required and must be a non-empty list", param="messages")
    contents: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise SimError(400, "each message must be an object with a `role`", param="messages")
        contents.append(_content_text(message.get("content")))
    key = "\x1e".join(f"{m['role']}\x1f{c}" for m, c in zip(messages, contents, strict=True))
    return key, chat_prompt_tokens(contents)


def _one_prompt(prompt: Any) -> tuple[str, int] | None:
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return ",".join(map(str, prompt)), len(prompt)
    return None


MAX_PROMPTS = 64


def _completion_prompts(body: dict[str, Any]) -> tuple[tuple[str, int], ...]:
    """A string, token ids, or a list of either (one choice set per prompt, as vLLM answers)."""
    prompt = body.get("prompt")
    one = _one_prompt(prompt)
    if one is not None:
        return (one,)
    if isinstance(prompt, list) and 0 < len(prompt) <= MAX_PROMPTS:
        each = [_one_prompt(p) for p in prompt]
        if all(p is not None for p in each):
            return tuple(p for p in each if p is not None)
    raise SimError(
        400,
        f"`prompt` is required: a string, a list of token ids, or a list of up to {MAX_PROMPTS} of either",
        param="prompt",
    )


def parse_generation(
    kind: Kind, body: dict[str, Any], models: tuple[str, ...], server_seed: int, max_model_len: int
) -> GenerationRequest:
    model = resolve_model(body, models)
    prompts: tuple[tuple[str, int], ...] = ()
    if kind == "chat":
        prompt_key, prompt_tokens = _chat_prompt(body)
    else:
        prompts = _completion_prompts(body)
        prompt_key = "\x1d".join(key for key, _ in prompts)
        prompt_tokens = sum(tokens for _, tokens in prompts)
        if len(prompts) == 1:
            prompts = ()
    try:
        output = parse_output(body, chat=kind == "chat")
    except OutputError as exc:
        raise SimError(400, str(exc), param=exc.param) from None
    max_tokens = _optional_int(body, "max_tokens", 1)
    if kind == "chat" and body.get("max_completion_tokens") is not None:
        max_tokens = _optional_int(body, "max_completion_tokens", 1)
    n = _optional_int(body, "n", 1) or 1
    seed = _optional_int(body, "seed", -(2**63))
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float)
    ):
        raise SimError(400, "`temperature` must be a number", param="temperature")
    stream = body.get("stream") is True
    options = body.get("stream_options")
    if options is not None and not stream:
        raise SimError(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
    if max_tokens is not None and max_tokens > max_model_len:
        # vLLM checks max_tokens alone first (param "max_tokens"), then prompt + max_tokens.
        raise SimError(
            400,
            f"max_tokens={max_tokens} cannot be greater than max_model_len={max_model_len}. Please request "
            f"fewer output tokens. (parameter=max_tokens, value={max_tokens})",
            param="max_tokens",
        )
    requested = max_tokens or 0
    longest = max((tokens for _, tokens in prompts), default=prompt_tokens)
    if longest + requested > max_model_len or longest >= max_model_len:
        raise SimError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you requested "
            f"{requested} output tokens and your prompt contains {longest} input tokens, for a total "
            f"of {longest + requested} tokens. Please reduce the length of the input prompt or the "
            "number of requested output tokens.",
        )
    greedy = temperature is not None and temperature == 0
    return GenerationRequest(
        kind=kind,
        model=model,
        prompt_key=prompt_key,
        prompt_tokens=prompt_tokens,
        n=n,
        max_tokens=max_tokens,
        sampling_key=None if greedy else f"{server_seed}/{seed}/{temperature}",
        stream=stream,
        include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        prompts=prompts,
        output=output,
    )


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def stream_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """The usage of the final stream chunk; vLLM serialises it without null fields."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def full_response(
    req: GenerationRequest, request_id: str, created: int, generations: list[Generation], fingerprint: str
) -> dict[str, Any]:
    """A non-streaming response with every key vLLM sends; the ones the simulator has no value for are null
    as in vLLM by default (no tool calls, no reasoning, no returned token ids, no KV transfer)."""
    choices: list[dict[str, Any]] = []
    for index, generation in enumerate(generations):
        choice: dict[str, Any] = {"index": index}
        top = req.output.logprobs
        if req.kind == "chat":
            message: dict[str, Any] = {
                "role": "assistant",
                "content": generation.text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
            }
            if generation.tool_call is not None:
                call_id, name, arguments = generation.tool_call
                message["content"] = None
                message["tool_calls"] = [
                    {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
                ]
            message["reasoning"] = None
            choice["message"] = message
            choice.update(
                logprobs=None if top is None else chat_logprobs(generation.tokens, top),
                finish_reason=generation.api_finish_reason,
                stop_reason=generation.stop_reason,
                token_ids=None,
                routed_experts=None,
            )
        else:
            choice.update(
                text=generation.text,
                logprobs=None if top is None else completion_logprobs(generation.tokens, top),
                finish_reason=generation.finish_reason,
                stop_reason=generation.stop_reason,
                token_ids=None,
                prompt_logprobs=None,
                prompt_token_ids=None,
                routed_experts=None,
            )
        choices.append(choice)
    completion_tokens = sum(len(g.tokens) for g in generations)
    response: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion" if req.kind == "chat" else "text_completion",
        "created": created,
        "model": req.model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": fingerprint,
        "usage": usage(req.prompt_tokens, completion_tokens),
    }
    if req.kind == "chat":
        response.update(prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
    response.update(kv_transfer_params=None, ec_transfer_params=None, metrics=None)
    return response


def chat_logprobs(tokens: list[str], top: int, offset: int = 0) -> dict[str, Any]:
    """OpenAI's chat shape: one entry per generated token (the end-of-sequence token has no text)."""
    return {
        "content": [chat_token_logprobs(t, offset + i, top) for i, t in enumerate(tokens) if t],
        "refusal": None,
    }
