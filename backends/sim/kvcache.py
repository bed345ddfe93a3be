"""KV-cache blocks with automatic prefix caching, as vLLM's block pool keeps them.

A prompt's full blocks are named by a chain hash (block i's hash covers tokens 0..(i+1)*block_size),
so equal prefixes share names. Once a sequence has computed its prompt, its full blocks are
registered under those names; while any sequence uses a registered block it is shared, and when the
last user leaves it stays cached (still holding its KV) until the space is needed, least recently
freed first. Cached-but-unused blocks count as free, as in vLLM's `kv_cache_usage_perc`.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def block_hashes(prompt_key: str, prompt_tokens: int, block_size: int) -> list[int]:
    """Chain hashes of the prompt's full blocks.

    The simulator has no real token ids: the prompt text (or its ids) is split like `text.count_tokens`
    does, so the hashes follow the prompt's content block by block. Chat framing tokens are not in the
    key, so the block boundaries are approximate; only prefix equality matters here.
    """
    tokens = _TOKEN_RE.findall(prompt_key)
    full = min(len(tokens), prompt_tokens) // block_size
    hashes: list[int] = []
    previous = 0
    for index in range(full):
        previous = hash((previous, *tokens[index * block_size : (index + 1) * block_size]))
        hashes.append(previous)
    return hashes


@dataclass(slots=True)
class Holding:
    """The blocks one sequence group holds: shared (registered, by hash) and private ones."""

    shared: list[int] = field(default_factory=list)
    private: int = 0

    @property
    def blocks(self) -> int:
        return len(self.shared) + self.private


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.used = 0  # blocks referenced by at least one sequence
        self._refs: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, unreferenced, LRU first

    @property
    def free(self) -> int:
        return self.num_blocks - self.used

    def usage(self) -> float:
        return self.used / self.num_blocks if self.num_blocks else 0.0

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def cached_prefix(self, hashes: Sequence[int], limit: int) -> int:
        """How many leading blocks (at most `limit`) are cached, in use or not."""
        count = 0
        for value in hashes[:limit]:
            if value not in self._refs and value not in self._evictable:
                break
            count += 1
        return count

    def acquire(self, holding: Holding, hits: Sequence[int], new_blocks: int) -> bool:
        """Give a group the cached blocks `hits` and `new_blocks` new ones, or nothing if they do not fit."""
        revived = sum(1 for value in hits if value in self._evictable)
        if self.used + revived + new_blocks > self.num_blocks:
            return False
        for value in hits:
            if value in self._evictable:
                del self._evictable[value]
                self._refs[value] = 1
                self.used += 1
            else:
                self._refs[value] += 1
            holding.shared.append(value)
        self.used += new_blocks
        holding.private += new_blocks
        self._evict_to_fit()
        return True

    def grow(self, holding: Holding, blocks: int) -> bool:
        return self.acquire(holding, (), blocks) if blocks > 0 else True

    def register(self, holding: Holding, hashes: Sequence[int]) -> None:
        """Name a group's computed prompt blocks so later prompts can share them."""
        for value in hashes[len(holding.shared) :]:
            if holding.private == 0 or value in self._refs or value in self._evictable:
                break  # someone computed the same block at the same time: keep ours private
            self._refs[value] = 1
            holding.private -= 1
            holding.shared.append(value)

    def release(self, holding: Holding) -> None:
        self.used -= holding.private
        holding.private = 0
        for value in holding.shared:
            refs = self._refs[value] - 1
            if refs:
                self._refs[value] = refs
            else:
                del self._refs[value]
                self._evictable[value] = None
                self.used -= 1
        holding.shared.clear()
        self._evict_to_fit()

    def _evict_to_fit(self) -> None:
        while self._evictable and self.used + len(self._evictable) > self.num_blocks:
            self._evictable.popitem(last=False)
