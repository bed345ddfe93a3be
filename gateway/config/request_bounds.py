"""The bounds on what one request may ask for (`gateway.limits`), read by gateway/request/parse.py on every
request. A settings section in a module of its own (like gateway/config/batches.py), below both settings.py
and the request path, which reads settings: so neither imports the other's package.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

_Count = Annotated[int, msgspec.Meta(ge=1)]


class RequestLimits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """What one request may ask for; past a bound the answer is 400 `invalid_value` naming the parameter."""

    max_n: _Count = 128
    max_tokens: _Count = 131_072
    """Also bounds `max_completion_tokens`."""
    max_best_of: _Count = 20
    max_logprobs: _Count = 20
    """`logprobs` of /v1/completions and `top_logprobs` of /v1/chat/completions."""
    max_messages: _Count = 2048
    max_prompt_chars: _Count = 2_000_000
    """Characters of prompt text (all messages, the prompt, or all embedding inputs)."""
    max_embedding_inputs: _Count = 2048
    """Items of an embeddings `input` list."""
