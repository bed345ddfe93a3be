"""The simulator's `/v1/embeddings`: deterministic unit vectors (text.embed), OpenAI's list shape."""

from __future__ import annotations

import base64
import os
import struct
import time
from typing import Any

from backends.sim.protocol import SimError, resolve_model
from backends.sim.text import EMBEDDING_DIM, count_tokens, embed


def embeddings_answer(body: dict[str, Any], models: tuple[str, ...]) -> dict[str, Any]:
    """The answer to an embeddings request (raises SimError for a bad one)."""
    model = resolve_model(body, models)
    inputs = _embedding_inputs(body.get("input"))
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise SimError(400, "`encoding_format` must be `float` or `base64`", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        isinstance(dimensions, bool)
        or not isinstance(dimensions, int)
        or not 1 <= dimensions <= EMBEDDING_DIM
    ):
        raise SimError(400, f"`dimensions` must be an integer from 1 to {EMBEDDING_DIM}", param="dimensions")
    data: list[dict[str, Any]] = []
    prompt_tokens = 0
    for index, (key, tokens) in enumerate(inputs):
        prompt_tokens += tokens
        vector = embed(f"{model}\x1f{key}", dimensions)
        value: Any = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": index, "embedding": value})
    return {
        "id": f"embd-{os.urandom(16).hex()}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


def _embedding_inputs(value: Any) -> list[tuple[str, int]]:
    """(hash key, token count) per input: a string, a list of strings, token ids, or lists of token ids."""
    if isinstance(value, str):
        return [(value, count_tokens(value))]
    if isinstance(value, list) and value:
        if all(type(t) is int for t in value):
            return [(",".join(map(str, value)), len(value))]
        if all(isinstance(item, str) for item in value):
            return [(item, count_tokens(item)) for item in value]
        if all(isinstance(item, list) and all(type(t) is int for t in item) for item in value):
            return [(",".join(map(str, item)), len(item)) for item in value]
    raise SimError(400, "`input` must be a string, a list of strings or a list of token ids", param="input")
