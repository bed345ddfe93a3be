"""Deterministic stand-ins for a tokenizer, a sampler and an embedding model.

Tokenizer: every run of word characters is one token and every other non-space character is one
token (`re` pattern `\\w+|[^\\w\\s]`). Generated words come from a fixed vocabulary of plain words, so
re-tokenizing generated text gives back the count the simulator reported. A stop is modelled as an
end-of-sequence token with empty text, which vLLM also counts as a completion token.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

FinishReason = Literal["stop", "length"]
"""The engine's reasons (vLLM's metrics count a tool call as `stop`; the API says `tool_calls`)."""

EMBEDDING_DIM = 64
CHAT_TOKENS_PER_MESSAGE = 4  # role header and end-of-turn markers a chat template adds
CHAT_TOKENS_FOR_REPLY = 3  # the assistant header that opens the generation
MIN_NATURAL_TOKENS = 16
MAX_NATURAL_TOKENS = 64

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")

_WORDS = """
    the a of and to in is that for it as with was on be by this are from at or an have not
    which but all were when we there can more if will one about some would so what out up into
    them only time could these two may then do first any like now over such our new other most
    also made after use way many must before through back years where much your good well down
    should because each just those people how too little state world very still own see men work
    long here get both between life being under never day same another know while last might us
    great old year off come since against go came right used take three system model token
    router backend latency batch cache memory kernel tensor prefill decode stream request gateway
"""
VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())


def count_tokens(text: str) -> int:
    return len(_TOKEN_RE.findall(text))


_PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")


def tokenize(text: str) -> list[str]:
    """`text` in `count_tokens(text)` pieces (a token with the spaces before it) that join back to it."""
    pieces = _PIECE_RE.findall(text)
    rest = len(text) - sum(map(len, pieces))
    if pieces and rest:
        pieces[-1] += text[-rest:]
    return pieces or ([text] if text else [])


def chat_prompt_tokens(messages: Iterable[str]) -> int:
    """Tokens a chat template would feed the model: each message's content plus its framing."""
    total = CHAT_TOKENS_FOR_REPLY
    for content in messages:
        total += count_tokens(content) + CHAT_TOKENS_PER_MESSAGE
    return total


def _rng(*parts: object) -> random.Random:
    digest = hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "little"))


@dataclass(frozen=True, slots=True)
class Generation:
    """One choice's output: the text of each generated token, in order."""

    tokens: list[str]
    finish_reason: FinishReason
    stop_reason: str | None = None
    """The stop string that ended it (vLLM's `stop_reason`), if one did."""
    tool_call: tuple[str, str, str] | None = None
    """(call id, function name, arguments JSON) of a tool call (its tokens are the arguments)."""

    @property
    def text(self) -> str:
        return "".join(self.tokens)

    @property
    def api_finish_reason(self) -> str:
        return (
            "tool_calls"
            if self.tool_call is not None and self.finish_reason == "stop"
            else self.finish_reason
        )


def generate(
    model: str, prompt_key: str, sampling_key: str | None, index: int, max_tokens: int | None, room: int
) -> Generation:
    """Draw a choice's tokens; the same arguments always give the same tokens.

    `sampling_key` is the request's `GenerationRequest.sampling_key` (server seed, request seed and
    temperature), None when sampling is greedy.

    With `max_tokens` the output has exactly that many tokens (finish "length"); otherwise it has a
    natural length of 16..64 tokens, the last being an empty end-of-sequence token (finish "stop"),
    unless `room` (what is left of the context window) cuts it short first.
    """
    rng = _rng(model, prompt_key, sampling_key, index)
    finish: FinishReason
    if max_tokens is not None:
        count, finish = max_tokens, "length"
    else:
        natural = rng.randint(MIN_NATURAL_TOKENS, MAX_NATURAL_TOKENS)
        count, finish = (room, "length") if natural > room else (natural, "stop")
    words = len(VOCABULARY)
    word_count = count - 1 if finish == "stop" else count
    tokens = [VOCABULARY[int(rng.random() * words)] for _ in range(word_count)]
    tokens = [tokens[0].capitalize(), *(" " + word for word in tokens[1:])] if tokens else []
    if finish == "stop":
        tokens.append("")
    return Generation(tokens=tokens, finish_reason=finish)


def embed(key: str, dimensions: int | None = None) -> list[float]:
    """A unit-length vector that depends only on `key`; with `dimensions`, its first that many components,
    normalised again (as a Matryoshka model shortens its embeddings)."""
    rng = _rng("embedding", key)
    vector = [rng.gauss(0.0, 1.0) for _ in range(EMBEDDING_DIM)][: dimensions or EMBEDDING_DIM]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]
