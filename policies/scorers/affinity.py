"""The `prefix-affinity` scorer: the same session or prompt prefix goes to the same backend.

Rendezvous hashing over the candidates: the backend with the highest hash of (key, backend) scores 1,
the others 0. Adding or losing a backend moves only the keys that hashed to it, and every gateway
replica makes the same choice (the hash is stable, not Python's per-process `hash`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import msgspec

from backends.models import Backend
from policies.framework import RouteContext


class PrefixAffinityParams(msgspec.Struct, forbid_unknown_fields=True):
    prefix_chars: int = 512
    """How much of the prompt start identifies a shared prefix (a system prompt, a RAG document)."""


_MULTIPLIER = 0xBF58476D1CE4E5B9
_MASK = 0xFFFFFFFFFFFFFFFF


class PrefixAffinity:
    """The same session (`x-session-id`, or the body's `user`), else the same first `prefix_chars` of the
    prompt, goes to the same backend: the candidate with the highest rendezvous hash of (key, backend)
    scores 1, the others 0. A request with neither scores every candidate 0."""

    name = "prefix-affinity"
    scores_in_unit_range = True
    reads_predictions = False

    def __init__(self, params: PrefixAffinityParams | None = None) -> None:
        self.prefix_chars = (params or PrefixAffinityParams()).prefix_chars
        self._salts: dict[str, int] = {}

    def _salt(self, backend: Backend) -> int:
        salt = self._salts.get(backend.name)
        if salt is None:
            salt = self._salts[backend.name] = zlib.crc32(backend.name.encode()) * 0x100000001
        return salt

    def score(self, ctx: RouteContext, candidates: Sequence[Backend]) -> list[float]:
        key_text = ctx.profile.session or ctx.profile.prompt_prefix(self.prefix_chars)
        if not key_text:
            return [0.0] * len(candidates)
        key = zlib.crc32(key_text.encode("utf-8", "surrogatepass")) * 0x9E3779B97F4A7C15
        salts = self._salts
        weights = [((key ^ (salts.get(b.name) or self._salt(b))) * _MULTIPLIER) & _MASK for b in candidates]
        best = max(weights)
        return [1.0 if w == best else 0.0 for w in weights]
