"""What stands in for a recorded request's prompt, which the access log never keeps: the profile the policy
engine classifies and routes (from the logged inputs of classification), the key `prefix-affinity` hashes,
and the names of the prompt's KV-cache blocks (from the logged prefix hashes)."""

from __future__ import annotations

from gateway.ledger.records import AccessLine
from gateway.request.prompt_size import PromptSizer
from loadtest.whatif.accesslog import Recorded
from policies.profile import RequestProfile, context_needed

PREFIX_BLOCK_CHARS = 1024
"""Characters per `prefix` hash of the access log (gateway/telemetry/logs.py)."""


class _AffinityKey:
    """Stands in for the prompt: `prefix-affinity` hashes what `prompt_prefix` returns, so requests that
    shared a key when recorded share one here (the same backend for the same key)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def prompt_prefix(self, chars: int) -> str:
        return self.key


def prompt_chars(line: AccessLine) -> int:
    """The prompt's characters: logged, or (older logs) 4 x the estimate, which the gateway made from them
    at 4 characters per token (the recorded count stands in for an estimate never logged)."""
    return line.prompt_chars or 4 * (line.prompt_estimate or line.prompt_tokens)


class Profiles:
    """The requests as the gateway's classifier would see them, their prompts estimated as the gateway
    estimates them: by a `PromptSizer` taught by the counts of the answers before them."""

    def __init__(self) -> None:
        self.sizer = PromptSizer()

    def of(self, line: AccessLine) -> RequestProfile:
        key = line.key or "anonymous"
        estimate = self.sizer.estimate(line.model, key, prompt_chars(line))
        return RequestProfile(
            model=line.model,
            prompt_tokens_estimate=estimate,
            context_needed=context_needed(estimate, line.max_tokens),
            stream=line.stream,
            key_id=key,
            max_tokens=line.max_tokens,
            n=line.n,
            priority=line.priority,
            tenant=line.tenant,
            explicit_class=line.class_header,
            parsed=_AffinityKey(line.affinity) if line.affinity else None,
        )

    def counted(self, line: AccessLine) -> None:
        """The backend answered it with its count of the prompt's tokens (`usage.prompt_tokens`)."""
        self.sizer.learn(line.model, line.key or "anonymous", prompt_chars(line), line.prompt_tokens)


class BlockNames:
    """Names of prompts' KV blocks for the simulator's prefix cache, consistent across one replay."""

    def __init__(self) -> None:
        self._tokens_per_hash: dict[str, float] = {}

    def names(self, request: Recorded, block_size: int) -> list[int]:
        """The prompt's KV block names: blocks inside a recorded `prefix` hash are named by it, so prompts
        that shared a document share blocks (half a hash past the last shared one: where in the next hash's
        span the prompts diverged is unknown); the rest are the request's own.

        Tokens per hash come from the request (its tokens over its characters), but every prompt that opens
        with the same first hash uses the first one's figure: the same block then gets the same name in
        each, whatever the length of the rest of the prompt.
        """
        line = request.line
        prompt = line.prompt_tokens
        full = prompt // block_size
        prefix = line.prefix or ()
        chars = prompt_chars(line)
        hashes: list[int] = []
        if prefix and chars:
            per_hash = self._tokens_per_hash.setdefault(prefix[0], PREFIX_BLOCK_CHARS * prompt / chars)
            # A prompt sharing hashes 0..k-1 with another and not hash k shares some of block k too: on
            # average half. So the first half of each hash's span is named by the hash before it.
            shared = min(full, int((len(prefix) + 0.5) * per_hash) // block_size)
            for b in range(shared):
                at = ((b + 1) * block_size - 1) / per_hash
                k = int(at)
                hashes.append(hash((prefix[k - 1 if k and at - k < 0.5 else k], b)))
        # the request's own blocks (not a tuple of a negative index: hash(-1) == hash(-2) in CPython, which
        # made the second request of every replay find the first one's blocks in the cache)
        hashes.extend(hash(("own", request.index, b)) for b in range(len(hashes), full))
        return hashes
