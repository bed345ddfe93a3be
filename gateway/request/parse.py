"""Step 1 of the request path: read and validate the body, decide what is forwarded.

Only the fields the gateway needs are decoded into typed structs; the body itself is forwarded
byte-for-byte, so unknown parameters (vLLM extras such as `top_k` or `guided_json`) pass through
untouched. A streaming body is re-encoded once, to ask the backend for usage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from gateway.errors import GatewayError, invalid_request
from gateway.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    chat_decoder,
    completion_decoder,
    embedding_decoder,
)

Endpoint = Literal["chat", "completions", "embeddings"]

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
}

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
_json_encoder = msgspec.json.Encoder()


@dataclass(slots=True)
class ParsedRequest:
    endpoint: Endpoint
    model: str
    body: bytes
    stream: bool
    client_wants_usage: bool
    prompt_chars: int
    max_tokens: int | None
    n: int
    request: ChatCompletionRequest | CompletionRequest | EmbeddingRequest
    """The decoded fields, for what later steps read only sometimes (the prompt's start, metadata)."""

    @property
    def priority(self) -> str | None:
        metadata = getattr(self.request, "metadata", None)
        value = metadata.get("priority") if metadata else None
        return str(value) if value is not None else None

    @property
    def user(self) -> str | None:
        return self.request.user

    def prompt_prefix(self, chars: int) -> str:
        """The first `chars` characters of the prompt text (all messages, in order)."""
        request = self.request
        if isinstance(request, ChatCompletionRequest):
            parts: list[str] = []
            size = 0
            for message in request.messages:
                content = message.content
                text = content if isinstance(content, str) else _joined_text(content)
                parts.append(text[: chars - size])
                size += len(parts[-1])
                if size >= chars:
                    break
            return "\n".join(parts)[:chars]
        source = request.prompt if isinstance(request, CompletionRequest) else request.input
        return (source if isinstance(source, str) else _joined_text(source))[:chars]


def _joined_text(content: Any) -> str:
    if not isinstance(content, list):
        return ""
    out = []
    for part in content:
        if isinstance(part, str):
            out.append(part)
        elif isinstance(part, dict) and isinstance(part.get("text"), str):
            out.append(part["text"])
    return "".join(out)


def _validation_error(exc: msgspec.ValidationError) -> GatewayError:
    text = str(exc)
    match = _AT_PATH.search(text)
    reason = text[: match.start()] if match else text
    param = match.group(1) if match else None
    missing = _MISSING.match(reason)
    if missing:
        field = f"{param}.{missing.group(1)}" if param else missing.group(1)
        return invalid_request(
            f"Missing required parameter: `{field}`.", param=field, code="missing_required"
        )
    where = f" at `{param}`" if param else ""
    # msgspec says "Expected `int | null`, got `str`" for a wrong type, "Expected `int` >= 1" for a bad value.
    code = "invalid_type" if ", got `" in reason else "invalid_value"
    return invalid_request(f"Invalid value{where}: {reason}.", param=param or None, code=code)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    if not body:
        raise invalid_request("The request body is empty; a JSON object is required.", code="invalid_json")
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from None


def _text_chars(content: Any) -> int:
    if isinstance(content, str):
        return len(content)
    if isinstance(content, list):
        total = 0
        for part in content:
            if isinstance(part, str):
                total += len(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                total += len(part["text"])
            elif isinstance(part, list):
                total += 4 * len(part)  # token ids: count each as one token's worth of text
        return total
    return 0


def _with_usage_requested(body: bytes) -> bytes:
    """Re-encode a streaming body so the backend sends its final usage chunk."""
    data = msgspec.json.decode(body)
    options = data.get("stream_options")
    if not isinstance(options, dict):
        options = {}
    options["include_usage"] = True
    data["stream_options"] = options
    return _json_encoder.encode(data)


def parse(endpoint: Endpoint, body: bytes) -> ParsedRequest:
    """Validate a request body for `endpoint`; raises GatewayError (400) on anything malformed."""
    request: ChatCompletionRequest | CompletionRequest | EmbeddingRequest
    if endpoint == "chat":
        request = chat = _decode(chat_decoder, body)
        prompt_chars = sum(_text_chars(m.content) for m in chat.messages)
        model, stream, options, n = chat.model, bool(chat.stream), chat.stream_options, chat.n or 1
        max_tokens = chat.max_completion_tokens or chat.max_tokens
    elif endpoint == "completions":
        request = completion = _decode(completion_decoder, body)
        prompt_chars = _text_chars(completion.prompt)
        model, stream, options = completion.model, bool(completion.stream), completion.stream_options
        n = completion.n or 1
        max_tokens = completion.max_tokens
    else:
        request = embedding = _decode(embedding_decoder, body)
        if not embedding.input:
            raise invalid_request("`input` must not be empty.", param="input", code="invalid_value")
        prompt_chars = _text_chars(embedding.input)
        model, stream, options, n, max_tokens = embedding.model, False, None, 1, None
    if not model:
        raise invalid_request("`model` must not be empty.", param="model", code="invalid_value")
    wants_usage = bool(options and options.include_usage)
    if stream and not wants_usage:
        body = _with_usage_requested(body)
    return ParsedRequest(
        endpoint=endpoint,
        model=model,
        body=body,
        stream=stream,
        client_wants_usage=wants_usage,
        prompt_chars=prompt_chars,
        max_tokens=max_tokens,
        n=n,
        request=request,
    )
