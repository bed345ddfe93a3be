"""How many tokens a prompt is before a backend has counted it: its characters over a number of characters
per token learned from the counts the backends report (`usage.prompt_tokens`), per model and API key.

A fixed 4 characters per token is a fair guess for English under common tokenizers, but a model's
tokenizer and a caller's text move it (code, other languages, the simulator's 5 per token). Every class
rule on `prompt_tokens` and every context-window check reads this estimate: too high keeps prompts off
backends they fit; too low sends a prompt to a backend that refuses it, and the gateway then tries a
longer-context candidate (gateway/request/attempts.py), so an undercount costs a round trip, not the
request.

Each API key learns its own figure, so no caller's text moves another's estimates (in `auth.mode: open`
every caller is the one key `anonymous`). A key starts from the default, weighted as `PRIOR_TOKENS` of
counted prompts, and older counts fade once `WINDOW_TOKENS` are counted, so the figure follows text that
changes. It stays within `BOUNDS`.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_CHARS_PER_TOKEN = 4.0
PRIOR_TOKENS = 8_000.0
WINDOW_TOKENS = 200_000.0
BOUNDS = (1.0, 6.0)
MAX_TALLIES = 10_000
"""Keys remembered per gateway; the oldest learned is forgotten first (and starts from the default)."""


@dataclass(slots=True)
class _Tally:
    chars: float
    tokens: float


class PromptSizer:
    """The gateway's estimate of prompt tokens; `learn` is fed by every request a backend counted."""

    __slots__ = ("_tallies",)

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str], _Tally] = {}

    def chars_per_token(self, model: str, key: str) -> float:
        tally = self._tallies.get((model, key))
        if tally is None:
            return DEFAULT_CHARS_PER_TOKEN
        low, high = BOUNDS
        return min(high, max(low, tally.chars / tally.tokens))

    def estimate(self, model: str, key: str, chars: int) -> int:
        """Tokens, rounded up."""
        return -int(-chars // self.chars_per_token(model, key))

    def learn(self, model: str, key: str, chars: int, tokens: int) -> None:
        """A backend counted `tokens` for a prompt of `chars` characters."""
        if chars <= 0 or tokens <= 0:
            return
        tallies = self._tallies
        tally = tallies.pop((model, key), None)  # re-inserted last: the dict's order is the age
        if tally is None:
            tally = _Tally(DEFAULT_CHARS_PER_TOKEN * PRIOR_TOKENS, PRIOR_TOKENS)
            if len(tallies) >= MAX_TALLIES:
                del tallies[next(iter(tallies))]
        tally.chars += chars
        tally.tokens += tokens
        if tally.tokens > WINDOW_TOKENS:
            fade = WINDOW_TOKENS / tally.tokens
            tally.chars *= fade
            tally.tokens *= fade
        tallies[(model, key)] = tally
