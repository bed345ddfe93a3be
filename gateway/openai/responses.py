"""The parts of OpenAI responses the gateway reads (usage) and the bodies it writes itself (model list)."""

from __future__ import annotations

import msgspec


class Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class UsageOnly(msgspec.Struct):
    """Any response or stream chunk, read for its usage; msgspec skips the rest without building it."""

    usage: Usage | None = None
    choices: list[msgspec.Raw] | None = None


class Model(msgspec.Struct):
    id: str
    created: int
    owned_by: str
    max_model_len: int
    object: str = "model"


class ModelList(msgspec.Struct):
    data: list[Model]
    object: str = "list"


usage_decoder = msgspec.json.Decoder(UsageOnly)


def answer_usage(body: bytes) -> Usage | None:
    """A whole answer's usage; None when it is not in OpenAI's shape (then accounted from estimates)."""
    try:
        return usage_decoder.decode(body).usage
    except msgspec.DecodeError:
        return None


class TokenUsage(msgspec.Struct):
    """Usage as the Responses and Messages APIs count it."""

    input_tokens: int | None = None
    output_tokens: int | None = None


class TokenUsageOnly(msgspec.Struct):
    """A Responses or Messages answer, read for its usage."""

    usage: TokenUsage | None = None


token_usage_decoder = msgspec.json.Decoder(TokenUsageOnly)
