"""Continuous batching as vLLM schedules it: a running batch, a waiting queue, one step at a time.

Pure bookkeeping, no I/O and no clock of its own: `plan()` picks the work of the next step,
`PerfModel` prices it, and `apply()` records its outcome at the step's simulated end time.

Each step: every running group in decode produces one token per unfinished choice; groups still in
prefill continue their prompt in chunks; then waiting groups are admitted first come, first served,
while the step's token budget (`max_num_batched_tokens`), `max_num_seqs` and free KV blocks allow.
Admission reserves KV blocks for the whole prompt (minus blocks found in the prefix cache), so a
backend admits as many long prompts as its memory holds and queues the rest. Decode grows a group
block by block; when no block is left the most recently admitted group is preempted (its blocks
freed, it goes back to the head of the queue and recomputes its prompt and output on readmission),
as vLLM's recompute preemption does. A request with `n` choices is one group whose choices advance
in lockstep and share the prompt's blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from backends.sim.kvcache import BlockPool, Holding
from backends.sim.metrics import EngineStats
from backends.sim.perf import StepWork
from backends.sim.profiles import EngineLimits


@dataclass(eq=False, slots=True)
class Group:
    """One request: its prompt, its choices' lengths and where it is in the engine."""

    prompt_tokens: int
    hashes: list[int]
    lengths: list[int]
    reasons: list[str]
    arrival: float
    target: int = 0  # tokens to compute before decoding: the prompt, or prompt + output after preemption
    computed: int = 0
    generated: int = 0
    first_token_at: float = -1.0
    last_token_at: float = 0.0
    admitted: bool = False
    ready: float = 0.0  # not admitted before this (a calibrated server's front end under load)
    done: bool = False
    holding: Holding = field(default_factory=Holding)
    waiter: Any = None  # the engine's future for whoever waits on this group
    want: int = 0  # wake the waiter once `generated` reaches this

    def __post_init__(self) -> None:
        self.target = self.prompt_tokens

    @property
    def n(self) -> int:
        return len(self.lengths)

    @property
    def steps(self) -> int:
        return max(self.lengths)

    @property
    def context(self) -> int:
        return self.prompt_tokens + self.generated


@dataclass(slots=True)
class Plan:
    prefill: list[tuple[Group, int]]
    decode: list[Group]
    work: StepWork


class Scheduler:
    def __init__(self, limits: EngineLimits, num_blocks: int, stats: EngineStats) -> None:
        self.limits = limits
        self.pool = BlockPool(num_blocks, limits.block_size)
        self.stats = stats
        self.waiting: deque[Group] = deque()
        self.running: list[Group] = []
        stats.kv_capacity_tokens = num_blocks * limits.block_size
        stats.block_size = limits.block_size
        stats.num_blocks = num_blocks

    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def add(self, group: Group) -> None:
        self.waiting.append(group)
        self.stats.waiting += group.n

    def abort(self, group: Group) -> None:
        """Drop a group wherever it is; its unfinished choices count as aborted."""
        if group.done:
            return
        group.done = True
        stats = self.stats
        if group in self.running:
            self.running.remove(group)
            stats.running -= group.n
        else:
            self.waiting.remove(group)
            stats.waiting -= group.n
        stats.finished["abort"] += sum(1 for length in group.lengths if length > group.generated)
        self.pool.release(group.holding)
        self._update_kv()

    def plan(self, now: float) -> Plan:
        budget = self.limits.max_num_batched_tokens
        decode: list[Group] = []
        prefill: list[tuple[Group, int]] = []
        for group in list(self.running):
            if group.done or group.computed < group.target:
                continue
            if not self._grow_for_next_token(group):
                continue  # preempted itself
            decode.append(group)
            budget -= group.n
        for group in self.running:
            if group.computed < group.target and budget > 0:
                chunk = min(group.target - group.computed, budget)
                prefill.append((group, chunk))
                budget -= chunk
        self._admit(now, budget, prefill)
        self._update_kv()
        prefill_context = sum(chunk * (g.computed + chunk / 2) for g, chunk in prefill)
        work = StepWork(
            prefill_tokens=sum(chunk for _, chunk in prefill),
            prefill_context=prefill_context,
            prefill_seqs=len(prefill),
            decode_seqs=sum(g.n for g in decode),
            decode_context=sum(g.n * g.context for g in decode),
        )
        return Plan(prefill=prefill, decode=decode, work=work)

    def _grow_for_next_token(self, group: Group) -> bool:
        pool = self.pool
        needed = pool.blocks_for(group.prompt_tokens + group.n * (group.generated + 1)) - group.holding.blocks
        while not pool.grow(group.holding, needed):
            victim = self.running[-1]
            self._preempt(victim)
            if victim is group:
                return False
        return True

    def _preempt(self, group: Group) -> None:
        self.running.remove(group)
        self.pool.release(group.holding)
        group.computed = 0
        group.target = group.prompt_tokens + group.n * group.generated
        self.waiting.appendleft(group)
        self.stats.running -= group.n
        self.stats.waiting += group.n
        self.stats.preemptions += 1

    def _admit(self, now: float, budget: int, prefill: list[tuple[Group, int]]) -> None:
        pool, stats, block = self.pool, self.stats, self.limits.block_size
        seqs = sum(g.n for g in self.running)
        while self.waiting and budget > 0:
            group = self.waiting[0]
            if group.ready > now:  # still in a calibrated server's front end (HTTP, tokenisation)
                break
            if seqs + group.n > self.limits.max_num_seqs:
                break
            # at least one token is always computed, as vLLM does, so a full hit still runs a step
            hits = group.hashes[: pool.cached_prefix(group.hashes, (group.target - 1) // block)]
            if not pool.acquire(group.holding, hits, pool.blocks_for(group.target) - len(hits)):
                break
            self.waiting.popleft()
            self.running.append(group)
            seqs += group.n
            stats.waiting -= group.n
            stats.running += group.n
            group.computed = len(hits) * block
            if not group.admitted:
                group.admitted = True
                stats.prompt_tokens += group.prompt_tokens
                stats.prefix_cache_queries += group.prompt_tokens
                stats.prefix_cache_hits += group.computed
                stats.queue.observe(max(0.0, now - group.arrival))
            chunk = min(group.target - group.computed, budget)
            prefill.append((group, chunk))
            budget -= chunk

    def apply(self, plan: Plan, end: float) -> list[Group]:
        """Record the step's outcome at simulated time `end`; returns the groups that produced tokens."""
        progressed: list[Group] = []
        for group, chunk in plan.prefill:
            if group.done:
                continue
            group.computed += chunk
            if group.computed >= group.target:
                if group.generated == 0:
                    self.pool.register(group.holding, group.hashes)
                self._token(group, end)
                progressed.append(group)
        for group in plan.decode:
            if not group.done:
                self._token(group, end)
                progressed.append(group)
        self._update_kv()
        return progressed

    def _token(self, group: Group, end: float) -> None:
        stats = self.stats
        step = group.generated
        active = sum(1 for length in group.lengths if length > step)
        if step == 0:
            group.first_token_at = end
            for _ in range(active):
                stats.ttft.observe(end - group.arrival)
        else:
            gap = end - group.last_token_at
            for _ in range(active):
                stats.itl.observe(gap)
        group.last_token_at = end
        group.generated = step + 1
        stats.generation_tokens += active
        for length, reason in zip(group.lengths, group.reasons, strict=True):
            if length == step + 1:
                stats.finished[reason] += 1
                stats.e2e.observe(end - group.arrival)
                if length > 1:
                    stats.tpot.observe((end - group.first_token_at) / (length - 1))
        if group.generated >= group.steps:
            group.done = True
            self.running.remove(group)
            stats.running -= group.n
            self.pool.release(group.holding)

    def _update_kv(self) -> None:
        self.stats.kv_tokens = self.pool.used * self.limits.block_size
