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

from gateway.config.request_bounds import RequestLimits
from gateway.openai.errors import GatewayError, invalid_request
from gateway.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    EmbeddingRequest,
    MessagesRequest,
    ResponsesRequest,
    chat_decoder,
    completion_decoder,
    embedding_decoder,
    messages_decoder,
    responses_decoder,
)

Endpoint = Literal["chat", "completions", "embeddings", "messages", "responses"]

UPSTREAM_PATHS: dict[Endpoint, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "embeddings": "/v1/embeddings",
    "messages": "/v1/messages",
    "responses": "/v1/responses",
}
TYPED_EVENTS: frozenset[Endpoint] = frozenset({"messages", "responses"})
"""Endpoints whose streams are typed events (`event:` lines) that always carry usage, and whose usage
counts `input_tokens`/`output_tokens` (gateway/request/typed_sse.py)."""

PROMPT_PARAMS: dict[str, str] = {"completions": "prompt", "embeddings": "input", "responses": "input"}
"""The parameter that holds an endpoint's prompt (`messages` otherwise), named by a too-long error."""


def prompt_param(parsed: object) -> str:
    return PROMPT_PARAMS.get(getattr(parsed, "endpoint", "chat"), "messages")


AnyRequest = ChatCompletionRequest | CompletionRequest | EmbeddingRequest | MessagesRequest | ResponsesRequest

_AT_PATH = re.compile(r" - at `\$\.?([^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `([^`]+)`")
_OUT_OF_RANGE = re.compile(r"(>=|<=|<|>) ")
_json_encoder = msgspec.json.Encoder()
_raw_fields = msgspec.json.Decoder(dict[str, msgspec.Raw])

DEFAULT_LIMITS = RequestLimits()
"""The bounds of a gateway whose config sets no `gateway.limits`, and of callers outside a gateway (the
policy CLI, tests); the gateway passes its own (`Pipeline.request_limits`)."""


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
    request: AnyRequest
    """The decoded fields, for what later steps read only sometimes (the prompt's start, metadata)."""
    typed: bool = False
    """A Messages or Responses API request (`TYPED_EVENTS`)."""

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
        if isinstance(request, ChatCompletionRequest | MessagesRequest):
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
        if isinstance(request, ResponsesRequest):
            source = request.input
            if isinstance(source, list):
                return "\n".join(_joined_text(_item_content(item)) for item in source)[:chars]
            return source[:chars]
        source = request.prompt if isinstance(request, CompletionRequest) else request.input
        return (source if isinstance(source, str) else _joined_text(source))[:chars]


def _item_content(item: Any) -> list[Any]:
    """A Responses input item's text parts (a message's content, a tool's output)."""
    if not isinstance(item, dict):
        return []
    content = item.get("content", item.get("output"))
    return [content] if isinstance(content, str) else content if isinstance(content, list) else []


def response_items_chars(items: list[Any]) -> int:
    return sum(_text_chars(_item_content(item)) for item in items)


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
    code = "invalid_value" if _OUT_OF_RANGE.search(reason) else "invalid_type"
    return invalid_request(f"Invalid value{where}: {reason}.", param=param or None, code=code)


def _decode(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    """Decode `body`, which is forwarded as is only if all of it is checked: msgspec skips unknown fields
    without validating their text, so the whole body's UTF-8 is checked here (a C pass, ~0.1 us per KB);
    nesting deeper than the interpreter's recursion limit (about 1,000) is refused by msgspec itself."""
    if not body:
        raise invalid_request("The request body is empty; a JSON object is required.", code="invalid_json")
    try:
        body.decode()
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        raise _validation_error(exc) from None
    except msgspec.DecodeError as exc:
        raise invalid_request(f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    except UnicodeDecodeError as exc:
        raise invalid_request(
            f"The request body is not valid JSON: invalid UTF-8 at byte {exc.start}.", code="invalid_json"
        ) from None
    except RecursionError:
        raise invalid_request(
            "The request body is not valid JSON: nested too deeply.", code="invalid_json"
        ) from None


def _too_large(param: str, value: int, bound: int, what: str = "") -> GatewayError:
    return invalid_request(
        f"`{param}` is {value}{what}; the gateway allows at most {bound}.", param=param, code="invalid_value"
    )


def _check_typed_bounds(limits: RequestLimits, request: MessagesRequest | ResponsesRequest) -> None:
    items: str | list[Any]
    wanted: int | None
    if isinstance(request, MessagesRequest):
        items, param, wanted, wanted_param = request.messages, "messages", request.max_tokens, "max_tokens"
    else:
        items, param = request.input, "input"
        wanted, wanted_param = request.max_output_tokens, "max_output_tokens"
        if not items:
            raise invalid_request("`input` must not be empty.", param="input", code="invalid_value")
    if isinstance(items, list) and len(items) > limits.max_messages:
        raise _too_large(param, len(items), limits.max_messages, " items")
    if wanted is not None and wanted > limits.max_tokens:
        raise _too_large(wanted_param, wanted, limits.max_tokens)


def _check_bounds(
    limits: RequestLimits, request: ChatCompletionRequest | CompletionRequest | EmbeddingRequest
) -> None:
    if isinstance(request, EmbeddingRequest):
        items = request.input
        if isinstance(items, list):
            if not items:
                raise invalid_request("`input` must not be empty.", param="input", code="invalid_value")
            if len(items) > limits.max_embedding_inputs:
                raise _too_large("input", len(items), limits.max_embedding_inputs, " items")
        return
    n = request.n
    if n is not None and n > limits.max_n:
        raise _too_large("n", n, limits.max_n)
    if request.max_tokens is not None and request.max_tokens > limits.max_tokens:
        raise _too_large("max_tokens", request.max_tokens, limits.max_tokens)
    if isinstance(request, ChatCompletionRequest):
        if len(request.messages) > limits.max_messages:
            raise _too_large("messages", len(request.messages), limits.max_messages, " messages")
        wanted = request.max_completion_tokens
        if wanted is not None and wanted > limits.max_tokens:
            raise _too_large("max_completion_tokens", wanted, limits.max_tokens)
        top = request.top_logprobs
        if top is not None and not 0 <= top <= limits.max_logprobs:
            raise _too_large("top_logprobs", top, limits.max_logprobs)
        return
    if request.best_of is not None and not 1 <= request.best_of <= limits.max_best_of:
        raise _too_large("best_of", request.best_of, limits.max_best_of)
    if request.logprobs is not None and not 0 <= request.logprobs <= limits.max_logprobs:
        raise _too_large("logprobs", request.logprobs, limits.max_logprobs)


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
    """Re-encode a streaming body so the backend sends its final usage chunk. The other fields are copied
    as their raw JSON text, never decoded (a 5,000-digit number in an unknown field is forwarded as sent)."""
    data: dict[str, Any] = _raw_fields.decode(body)
    raw = data.get("stream_options")
    options = msgspec.json.decode(raw) if raw is not None else None
    if not isinstance(options, dict):
        options = {}
    options["include_usage"] = True
    data["stream_options"] = options
    return _json_encoder.encode(data)


def parse(endpoint: Endpoint, body: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> ParsedRequest:
    """Validate a request body for `endpoint` within `limits`; raises GatewayError (400) on anything
    malformed or out of bounds."""
    request: ChatCompletionRequest | CompletionRequest | EmbeddingRequest
    if endpoint == "chat":
        request = chat = _decode(chat_decoder, body)
        prompt_chars = 0
        for m in chat.messages:  # a loop, not sum() over a generator: no generator frame per message
            prompt_chars += _text_chars(m.content)
        model, stream, options, n = chat.model, bool(chat.stream), chat.stream_options, chat.n or 1
        max_tokens = chat.max_completion_tokens or chat.max_tokens
    elif endpoint == "completions":
        request = completion = _decode(completion_decoder, body)
        prompt_chars = _text_chars(completion.prompt)
        model, stream, options = completion.model, bool(completion.stream), completion.stream_options
        n = completion.n or 1
        max_tokens = completion.max_tokens
    elif endpoint == "messages" or endpoint == "responses":
        return _parse_typed(endpoint, body, limits)
    else:
        request = embedding = _decode(embedding_decoder, body)
        if not embedding.input:
            raise invalid_request("`input` must not be empty.", param="input", code="invalid_value")
        prompt_chars = _text_chars(embedding.input)
        model, stream, options, n, max_tokens = embedding.model, False, None, 1, None
    if not model:
        raise invalid_request("`model` must not be empty.", param="model", code="invalid_value")
    _check_bounds(limits, request)
    if prompt_chars > limits.max_prompt_chars:
        raise _too_large("prompt", prompt_chars, limits.max_prompt_chars, " characters")
    wants_usage = bool(options and options.include_usage)
    if stream and not wants_usage:
        try:
            body = _with_usage_requested(body)
        except RecursionError:
            raise invalid_request(
                "The request body is not valid JSON: nested too deeply.", code="invalid_json"
            ) from None
        except (msgspec.ValidationError, ValueError) as exc:  # within `stream_options` itself
            raise invalid_request(
                f"Invalid value at `stream_options`: {exc}.", param="stream_options", code="invalid_value"
            ) from None
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


def _parse_typed(endpoint: Endpoint, body: bytes, limits: RequestLimits) -> ParsedRequest:
    """A Messages or Responses API request: forwarded as is (its stream always carries usage)."""
    request: MessagesRequest | ResponsesRequest
    if endpoint == "messages":
        request = message = _decode(messages_decoder, body)
        prompt_chars = _text_chars(message.system) + sum(_text_chars(m.content) for m in message.messages)
        max_tokens: int | None = message.max_tokens
    else:
        request = response = _decode(responses_decoder, body)
        given = response.input
        prompt_chars = len(given) if isinstance(given, str) else response_items_chars(given)
        prompt_chars += len(response.instructions or "")
        max_tokens = response.max_output_tokens
    if not request.model:
        raise invalid_request("`model` must not be empty.", param="model", code="invalid_value")
    _check_typed_bounds(limits, request)
    if prompt_chars > limits.max_prompt_chars:
        raise _too_large("prompt", prompt_chars, limits.max_prompt_chars, " characters")
    return ParsedRequest(
        endpoint=endpoint,
        model=request.model,
        body=body,
        stream=bool(request.stream),
        client_wants_usage=False,
        prompt_chars=prompt_chars,
        max_tokens=max_tokens,
        n=1,
        request=request,
        typed=True,
    )


def check_expanded_input(limits: RequestLimits, prompt_chars: int, items: int) -> None:
    """The gateway's bounds on a Responses input grown by its earlier turns (`previous_response_id`)."""
    if items > limits.max_messages:
        raise _too_large("input", items, limits.max_messages, " items with the earlier turns")
    if prompt_chars > limits.max_prompt_chars:
        raise _too_large(
            "prompt", prompt_chars, limits.max_prompt_chars, " characters with the earlier turns"
        )
