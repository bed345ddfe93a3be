"""The parts of OpenAI request bodies the gateway reads. Every other field passes through untouched."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

_PositiveInt = Annotated[int, msgspec.Meta(ge=1)]


class StreamOptions(msgspec.Struct):
    include_usage: bool | None = None


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[Any] | None = None


class ChatCompletionRequest(msgspec.Struct):
    model: str
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: _PositiveInt | None = None
    max_completion_tokens: _PositiveInt | None = None
    n: _PositiveInt | None = 1
    top_logprobs: int | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


class CompletionRequest(msgspec.Struct):
    model: str
    prompt: str | list[Any]
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: _PositiveInt | None = None
    n: _PositiveInt | None = 1
    best_of: int | None = None
    logprobs: int | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


class EmbeddingRequest(msgspec.Struct):
    model: str
    input: str | list[Any]
    user: str | None = None


chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
completion_decoder = msgspec.json.Decoder(CompletionRequest)
embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)


class AnthropicMessage(msgspec.Struct):
    role: str
    content: str | list[Any]


class MessagesRequest(msgspec.Struct):
    """Anthropic's Messages API (`POST /v1/messages`), which vLLM serves too."""

    model: str
    messages: Annotated[list[AnthropicMessage], msgspec.Meta(min_length=1)]
    max_tokens: _PositiveInt
    system: str | list[Any] | None = None
    stream: bool | None = False
    metadata: dict[str, Any] | None = None

    @property
    def user(self) -> str | None:
        value = self.metadata.get("user_id") if self.metadata else None
        return value if isinstance(value, str) else None


class ResponsesRequest(msgspec.Struct):
    """OpenAI's Responses API (`POST /v1/responses`)."""

    model: str
    input: str | list[Any]
    instructions: str | None = None
    max_output_tokens: _PositiveInt | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


messages_decoder = msgspec.json.Decoder(MessagesRequest)
responses_decoder = msgspec.json.Decoder(ResponsesRequest)
