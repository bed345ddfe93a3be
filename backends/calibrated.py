"""A backend profile measured on a live vLLM server (`switchyard calibrate`): one per accelerator and model.

The profile is a linear step-time model of vLLM's continuous batching plus the scheduler limits the server
runs with, fitted by least squares on what the server itself reported (loadtest/calibrate/):

    step seconds    = step_s + seqs(sequences) + prefill(prefill tokens)
                      + per_context_token_s * decode context tokens
                      + mixed_step_s, in a step that prefills while other sequences decode
    seqs(b)         = per_seq_s * b, or, when the profile measured a decode curve (`decode`), that curve
                      interpolated at b (from (0, 0)) and extended beyond its last point with per_seq_s
    prefill(n)      = per_prefill_token_s * n, or, when the profile measured a curve (`prefill`), that
                      curve interpolated at n (from (0, 0)) and extended beyond its last point with
                      per_prefill_token_s; n is the step's total, all its requests' chunks together
    before its first step, every request spends request_s (plus request_per_seq_s per sequence running) in
    the server's front end (HTTP, tokenisation) on average, more or less from one request to the next by
    request_cv (backends/sim/frontend.py), and the front end takes one request at a time (vLLM's API server
    is one process: requests that arrive together queue for it; http_s of it is the client's own round
    trip, which a simulator's clients pay to the simulator instead),
    then waits admit_s (and, when the engine is busy, admit_busy_s more, and admit_per_seq_s per sequence
    running) before it is scheduled; a step the running sequences share does not wait for it
    and, when the profile measured the server's slow spells (`pace`), every step's time is multiplied by
    the factor of the spell it starts in (backends/sim/spells.py)

so the simulator's scheduler (backends/sim/scheduler.py) replays queueing, chunked prefill and KV-cache
pressure on it as it does on the datasheet profiles. The record also keeps what was measured (`points`,
each with the fit's prediction) and the fit's error on them, so an operator sees how far to trust it.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

from backends.accelerator_types import Priors
from backends.yamlfile import ConfigError, decode, parse_yaml

_NonNeg = Annotated[float, msgspec.Meta(ge=0)]
_Count = Annotated[int, msgspec.Meta(ge=1)]

PRIOR_PROMPT_TOKENS = 128
"""The short prompt a profile's TTFT prior is for (the datasheet priors' `ttft_s` is "a short prompt")."""


class Pace(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The server's slow spells: how much slower or faster than its mean a stretch of steps runs.

    A real server's steps do not take the same time for the same work every time: a neighbour's work, the
    CPU's clock, the allocator and the host move whole stretches of them (the same level run twice moves
    by a fifth on a shared machine). Within a request that is not noise that averages out: a request that
    lands in a slow spell is slow throughout. The sweep measures it as the spread of its requests' time per
    output token within levels of one shape, over stretches about as long as one of those requests
    (`spell_s`). `factors`: a spell's step-time factor, equally likely each; a slow spell holds fewer
    steps than a fast one, so they are that spread counted by time, and their harmonic mean is 1, so that
    steps counted one by one keep the fitted mean (loadtest/calibrate/pace.py)."""

    spell_s: Annotated[float, msgspec.Meta(gt=0)]
    factors: Annotated[list[_NonNeg], msgspec.Meta(min_length=1)]

    def __post_init__(self) -> None:
        if any(a > b for a, b in itertools.pairwise(self.factors)):
            raise ValueError("pace: the factors must not decrease")
        if not self.factors[0] > 0:
            raise ValueError("pace: every factor must be above 0")


class StepFit(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The fitted step-time model; every figure in seconds."""

    step_s: _NonNeg
    per_seq_s: _NonNeg
    per_prefill_token_s: _NonNeg
    """Per prompt token prefilled in a step; with a `prefill` curve, per token beyond its last point."""
    per_context_token_s: _NonNeg
    mixed_step_s: _NonNeg = 0.0
    """What a step that prefills a newcomer while other sequences decode costs on top of its prefill and its
    decode. On vLLM's CPU build, sixteen streams' median gap between tokens was 0.24-0.54 ms longer with
    newcomers arriving among them than between cohorts, for 16-token prompts as for 440-token ones; the fit
    put it at 1.3-2.2 ms a step (docs/calibrate.md, 2026-11-28, 07:30 UTC)."""
    request_s: _NonNeg = 0.0
    request_per_seq_s: _NonNeg = 0.0
    """The front end's extra time per sequence already running (its HTTP streams compete with new
    requests)."""
    request_cv: _NonNeg = 0.0
    """How much the front end's time varies from one request to the next (its standard deviation over its
    mean; 0: every request takes the mean, 1: as much as an exponential draw). A server's front end shares
    its process, and on a small machine its cores, with the streams it serves. `calibrate` reads it off
    the levels whose newcomers arrive among running streams (loadtest/calibrate/refine.fit_request_cv)."""
    http_s: _NonNeg = 0.0
    """Of the front end, what a bare request (`GET /health`) cost the client that measured it. A simulator
    served over HTTP makes its clients pay its own instead, so it holds a request that much less."""
    admit_s: _NonNeg = 0.0
    """Every request's wait between the front end and its first step (handing it to the engine process,
    adding it to the scheduler), counted in its TTFT, busy engine or not."""
    admit_busy_s: _NonNeg = 0.0
    """A newcomer's further wait when it reaches a busy engine (any sequence running) before it is
    scheduled, counted in its TTFT: the server's front end competing with the streams it serves."""
    admit_per_seq_s: _NonNeg = 0.0
    """And per sequence running: the server's front end hands a newcomer to the engine, and its first
    token back, between the outputs of every stream it serves."""
    prefill: list[tuple[_Count, _NonNeg]] = []
    """The measured prefill curve, `[tokens, seconds]` by tokens: what prefilling that many prompt tokens
    adds to a step (on top of step_s and per_seq_s). Prefill is not linear on real hardware (launch
    costs and under-filled matmuls make short prompts dear per token); empty: per_prefill_token_s alone."""

    decode: list[tuple[_Count, _NonNeg]] = []
    """The measured decode curve, `[sequences, seconds]` by sequences: what that many sequences in a step
    add to it (on top of step_s, the prefill and the context term), in place of per_seq_s a sequence.
    A real server's step does not grow in a line with its batch (a CPU's threads, a GPU's kernels fill
    up in steps), so a line through the levels on either side misses the ones between; empty:
    per_seq_s alone."""

    pace: Pace | None = None
    """The server's slow spells (`Pace`); None: every step takes its model's time."""

    def __post_init__(self) -> None:
        _check_curve("prefill", "token counts", self.prefill)
        _check_curve("decode", "sequence counts", self.decode)

    def prefill_seconds(self, tokens: float) -> float:
        """What prefilling `tokens` prompt tokens adds to a step: the step's total, however many requests'
        chunks make it up (one pass over the batch, not one per request)."""
        if tokens <= 0:
            return 0.0
        return _interpolate(self.prefill, tokens, self.per_prefill_token_s)

    def sequence_seconds(self, seqs: float) -> float:
        """What `seqs` sequences in a step add to it: the decode curve read at `seqs`, or per_seq_s each."""
        if not self.decode:
            return self.per_seq_s * seqs
        return _interpolate(self.decode, seqs, self.per_seq_s)

    def front_end(self, running: int) -> float:
        """Seconds from a request's arrival until the engine sees it, with `running` sequences in flight."""
        return self.request_s + self.request_per_seq_s * max(0, running)

    def admission_wait(self, running: int) -> float:
        if running <= 0:
            return self.admit_s
        return self.admit_s + self.admit_busy_s + self.admit_per_seq_s * running

    def step_seconds(self, seqs: int, prefill_tokens: float, decode_context: float) -> float:
        if seqs <= 0:
            return 0.0
        return (
            self.step_s
            + self.sequence_seconds(seqs)
            + self.prefill_seconds(prefill_tokens)
            + self.per_context_token_s * decode_context
            + (self.mixed_step_s if prefill_tokens > 0 and decode_context > 0 else 0.0)
        )


def _check_curve(name: str, what: str, curve: list[tuple[int, float]]) -> None:
    xs = [x for x, _ in curve]
    seconds = [s for _, s in curve]
    if any(a >= b for a, b in itertools.pairwise(xs)):
        raise ValueError(f"{name}: the curve's {what} must increase")
    if any(a > b for a, b in itertools.pairwise(seconds)):
        raise ValueError(f"{name}: the curve's seconds must not decrease")


def _interpolate(curve: list[tuple[int, float]], x: float, slope: float) -> float:
    """`curve` read at `x`: between its points from (0, 0), beyond its last one with `slope`."""
    below_x, below_s = 0, 0.0
    for at, seconds in curve:
        if x <= at:
            return below_s + (seconds - below_s) * (x - below_x) / (at - below_x)
        below_x, below_s = at, seconds
    return below_s + slope * (x - below_x)


class Limits(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The server's scheduler and KV-cache geometry (`vllm:cache_config_info`, `/v1/models`)."""

    block_size: _Count
    num_blocks: _Count
    max_num_seqs: _Count
    max_num_batched_tokens: _Count
    max_model_len: _Count

    @property
    def kv_capacity_tokens(self) -> int:
        return self.block_size * self.num_blocks


class Point(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One measured sweep level and what the fitted model predicts for it."""

    kind: Literal["ttft", "tpot"]
    concurrency: _Count
    prompt_tokens: _Count
    output_tokens: _Count
    measured_s: _NonNeg
    predicted_s: _NonNeg
    requests: _Count

    @property
    def error(self) -> float:
        return abs(self.predicted_s - self.measured_s) / self.measured_s if self.measured_s > 0 else 0.0


class FitError(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Mean and worst relative error of the fit on its own points, by kind."""

    ttft_mean: _NonNeg
    ttft_max: _NonNeg
    tpot_mean: _NonNeg
    tpot_max: _NonNeg


class Source(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    url: str
    measured_at: str
    """UTC, ISO 8601."""
    seconds: _NonNeg
    requests: int
    vllm_version: str = ""


class CalibratedProfile(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    accelerator: Annotated[str, msgspec.Meta(min_length=1)]
    model: Annotated[str, msgspec.Meta(min_length=1)]
    step: StepFit
    limits: Limits
    fit_error: FitError
    saturated_tokens_per_second: _NonNeg
    """The most output tokens a second the sweep saw (where throughput stopped growing, or the last level)."""
    prefix_cache_hit_rate: _NonNeg = 0.0
    """Of a repeated prompt's tokens, the fraction vLLM found in its prefix cache."""
    source: Source | None = None
    points: list[Point] = []

    def ttft_seconds(self, prompt_tokens: int) -> float:
        """At no load: the front end, the hand-over to the engine, then one step prefilling the prompt."""
        return (
            self.step.front_end(0) + self.step.admission_wait(0) + self.step.step_seconds(1, prompt_tokens, 0)
        )

    def tpot_seconds(self, sequences: int, context: int) -> float:
        """One decode step of `sequences` sequences of `context` tokens each."""
        return self.step.step_seconds(sequences, 0, sequences * context)

    @property
    def _prefill_per_token(self) -> float:
        """Seconds per prompt token in a step that prefills all the tokens a step may hold (the rate of a
        long prompt, or of a cohort's; per_prefill_token_s when there is no curve)."""
        if not self.step.prefill:
            return self.step.per_prefill_token_s
        full = self.limits.max_num_batched_tokens
        return self.step.prefill_seconds(full) / full

    @property
    def prefill_tokens_per_second(self) -> float:
        per_token = self._prefill_per_token
        return 1.0 / per_token if per_token > 0 else float("inf")

    @property
    def prefill_tokens_per_step(self) -> float:
        """Prompt tokens prefilled in the time of one single-sequence decode step (the batch scheduler's
        exchange rate, as the catalogue's `prefill_tokens_per_step`)."""
        per_token = self._prefill_per_token
        decode = self.tpot_seconds(1, PRIOR_PROMPT_TOKENS)
        return decode / per_token if per_token > 0 else float("inf")

    def priors(self) -> Priors:
        return Priors(
            tokens_per_second=self.saturated_tokens_per_second,
            ttft_s=self.ttft_seconds(PRIOR_PROMPT_TOKENS),
            tpot_s=self.tpot_seconds(1, PRIOR_PROMPT_TOKENS),
        )


def dump_profile(profile: CalibratedProfile) -> str:
    data = msgspec.to_builtins(profile)
    for curve in ("prefill", "decode"):
        if not getattr(profile.step, curve):
            del data["step"][curve]  # a profile without a curve is written as before it had one
    for measured_later in ("http_s", "admit_per_seq_s", "request_cv", "mixed_step_s"):
        if not getattr(profile.step, measured_later):
            del data["step"][measured_later]  # nor one measured before it was
    if profile.step.pace is None:
        del data["step"]["pace"]
    header = (
        f"# {profile.accelerator} / {profile.model}: measured by `switchyard calibrate` (docs/calibrate.md)\n"
    )
    return header + yaml.safe_dump(data, sort_keys=False)


def parse_profile(text: str, source: str = "<profile>") -> CalibratedProfile:
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, 1, "a calibrated profile is a mapping (written by `switchyard calibrate`)")
    return decode(data, lines, CalibratedProfile, source)


def load_profile(path: str | Path) -> CalibratedProfile:
    """Read and validate a profile file; raises ConfigError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read profile: {exc.strerror}") from None
    return parse_profile(text, str(path))
