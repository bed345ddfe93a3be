"""What a routing policy knows about one request: the profile the gateway's classify step fills in.

It lives here, below the gateway, so policies read it without importing the gateway
(gateway/request/classify.py builds it; policies/engine.py sets `request_class`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

DEFAULT_CLASS = "default"


class PromptText(Protocol):
    """The parsed request body, as far as routing reads it (gateway.request.parse.ParsedRequest)."""

    def prompt_prefix(self, chars: int) -> str: ...


def context_needed(prompt_tokens: int, max_tokens: int | None) -> int:
    """What `max_model_len` must hold: the prompt plus what the request may generate (at least a token).
    The gateway's classify step and the what-if replay both size requests by it."""
    return prompt_tokens + (max_tokens or 1)


@dataclass(slots=True, kw_only=True)
class RequestProfile:
    model: str
    prompt_tokens_estimate: int
    context_needed: int
    """Estimated prompt tokens plus the tokens the request may generate (`context_needed()`)."""
    stream: bool = False
    key_id: str = "anonymous"
    """A short, irreversible id of the caller's API key, for attribution; never the key itself."""
    max_tokens: int | None = None
    n: int = 1
    priority: str | None = None
    tenant: str | None = None
    session: str | None = None
    explicit_class: str | None = None
    parsed: PromptText | None = None
    headers: list[tuple[bytes, bytes]] | None = None
    request_class: str = DEFAULT_CLASS
    """Set by the routing policy once it has matched a class."""

    def prompt_prefix(self, chars: int) -> str:
        return self.parsed.prompt_prefix(chars) if self.parsed is not None else ""

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode("latin-1")
        for key, value in self.headers or ():
            if key == wanted:
                return value.decode("latin-1")
        return None
