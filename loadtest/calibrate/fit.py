"""Fitting the linear step-time model (backends/calibrated.py) to the sweep's levels.

Each level gives what vLLM's own histograms saw (mean TTFT and mean inter-token latency over the
level's requests), written as a row of the model's features:

- a prefill level (one request at a time, prompt P): its TTFT is one step of one sequence prefilling P
  tokens, features (1, 1, P, 0);
- every level's inter-token latency is the mean decode step of its B concurrent sequences of mean
  context C (prompt plus half the output), with, on average, B / O newcomers' prompts prefilled in the
  same step (in a closed loop each of the B streams starts a new request every O steps), features
  (1, B + B / O, B * P / O, B * C).

Least squares on relative error (each row divided by its measurement, so a 3 ms step counts as much as
a 300 ms one), with no coefficient below zero (a coefficient that comes out negative is fixed at zero
and the rest refitted).

Prefill is not linear in the prompt on real hardware (on vLLM's CPU build 16 tokens took 12-15 ms, 128
tokens 27 ms, 256 and 488 tokens 31-33 ms), so the profile also gets a measured curve (`prefill_curve`):
from every request the sweep sent alone, its prompt's share of the step.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from backends.calibrated import StepFit

FEATURES = ("step_s", "per_seq_s", "per_prefill_token_s", "per_context_token_s")


@dataclass(frozen=True, slots=True)
class Row:
    features: tuple[float, float, float, float]
    measured_s: float


def prefill_row(prompt_tokens: int, ttft_s: float) -> Row:
    return Row((1.0, 1.0, float(prompt_tokens), 0.0), ttft_s)


def decode_features(
    concurrency: float, prompt_tokens: float, output_tokens: float
) -> tuple[float, float, float, float]:
    b, p, o = concurrency, prompt_tokens, max(1.0, output_tokens)
    newcomers = b / o if b > 1 else 0.0  # one request at a time never prefills while it decodes
    return (1.0, b + newcomers, newcomers * p, b * (p + o / 2))


def decode_row(concurrency: float, prompt_tokens: float, output_tokens: float, itl_s: float) -> Row:
    return Row(decode_features(concurrency, prompt_tokens, output_tokens), itl_s)


def predict(coefficients: Sequence[float], features: Sequence[float]) -> float:
    return sum(c * x for c, x in zip(coefficients, features, strict=True))


def prefill_curve(
    step: StepFit, alone: Sequence[tuple[int, float]], max_tokens: int
) -> tuple[list[tuple[int, float]], float]:
    """The prefill curve (StepFit.prefill) and the admission latency (StepFit.admit_s) under which `step`
    reproduces what requests sent one at a time measured, `alone`: (prompt tokens, vLLM's mean TTFT).

    A request alone waits its admission, then runs one step of one sequence that prefills its whole
    prompt (when the prompt fits in a step, `max_tokens`; a longer one is chunked over several steps and
    left to per_prefill_token_s), so its TTFT less the rest of that step is its prompt's share plus its
    admission. The shares of the two shortest prompts, read back along their line to no prompt at all,
    give the admission: what every request pays whatever its prompt (handing it to the engine, its
    first token's way back), which does not lengthen the step the running sequences share. On vLLM's
    CPU build a 16-token newcomer among 11 decoding streams lengthened their step by nothing measurable
    while, alone, its TTFT exceeded a step by 2.4 ms (docs/calibrate.md); priced as step time, that
    hand-over slowed every running stream at each newcomer.

    The median per size, made non-decreasing (a longer prompt that measured faster is pooled with the
    shorter ones: noise); the admission at most the smallest share, so no share goes below zero."""
    by_size: dict[int, list[float]] = {}
    for tokens, ttft_s in alone:
        if 0 < tokens <= max_tokens and ttft_s > 0:
            by_size.setdefault(tokens, []).append(ttft_s)
    rest = step.step_s + step.sequence_seconds(1)
    sizes = sorted(by_size)
    shares = non_decreasing([max(0.0, statistics.median(by_size[t]) - rest) for t in sizes])
    latency = 0.0
    if len(sizes) >= 2:  # the first segment read back to no prompt (a line through all would bend)
        slope = (shares[1] - shares[0]) / (sizes[1] - sizes[0])
        latency = min(max(0.0, shares[0] - slope * sizes[0]), shares[0])
    return [(t, share - latency) for t, share in zip(sizes, shares, strict=True)], latency


def non_decreasing(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (sum, count) of each pooled run
    for value in values:
        total, count = value, 1
        while blocks and blocks[-1][0] / blocks[-1][1] > total / count:
            below_total, below_count = blocks.pop()
            total, count = total + below_total, count + below_count
        blocks.append((total, count))
    return [total / count for total, count in blocks for _ in range(count)]


ROBUST_ROUNDS = 8
"""Reweighting rounds towards least absolute relative error: a level a busy machine slowed pulls the fit
less than it would pull a plain least-squares one."""


def fit(rows: Sequence[Row]) -> tuple[float, ...]:
    """Non-negative, outlier-resistant fit on relative error; raises ValueError with fewer than 2 rows."""
    usable = [r for r in rows if r.measured_s > 0]
    if len(usable) < 2:
        raise ValueError("too few measured points to fit (need at least two levels that finished)")
    weights = [1.0] * len(usable)
    coefficients = _nonnegative(usable, weights)
    for _ in range(ROBUST_ROUNDS):
        residuals = [abs(predict(coefficients, r.features) - r.measured_s) / r.measured_s for r in usable]
        weights = [1.0 / max(residual, 0.02) for residual in residuals]
        coefficients = _nonnegative(usable, weights)
    return coefficients


def _nonnegative(rows: Sequence[Row], weights: Sequence[float]) -> tuple[float, ...]:
    """Weighted least squares with every coefficient at least zero (a negative one is fixed at zero and
    the rest refitted)."""
    free = [0, *(i for i in range(1, len(FEATURES)) if _varies(rows, i))]
    while True:
        solution = _solve(rows, weights, free)
        negative = [i for i in free if solution[i] < 0]
        if not negative:
            return tuple(max(0.0, v) for v in solution)
        free.remove(min(negative, key=lambda i: solution[i]))
        if not free:
            return tuple(0.0 for _ in FEATURES)


def _varies(rows: Sequence[Row], feature: int) -> bool:
    """Whether the sweep varied a feature apart from the fixed step (one request at a time only: the
    per-sequence cost cannot be told from the step's, and is left at zero rather than guessed)."""
    ratios = [row.features[feature] / row.features[0] for row in rows]
    return max(ratios) - min(ratios) > 1e-9 * max(1.0, max(abs(r) for r in ratios))


def _solve(rows: Sequence[Row], weights: Sequence[float], free: list[int]) -> list[float]:
    """Least squares on relative error over the `free` coefficients (the others zero), by the normal
    equations with a little ridge so a feature the sweep never varied does not make them singular."""
    n = len(free)
    a = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for row, weight in zip(rows, weights, strict=True):
        w = 1.0 / row.measured_s
        x = [row.features[i] * w for i in free]
        for i in range(n):
            b[i] += weight * x[i] * row.measured_s * w
            for j in range(n):
                a[i][j] += weight * x[i] * x[j]
    for i in range(n):
        a[i][i] += 1e-9 * (a[i][i] or 1.0)
    coefficients = gauss(a, b)
    out = [0.0] * len(FEATURES)
    for k, i in enumerate(free):
        out[i] = coefficients[k]
    return out


def gauss(a: list[list[float]], b: list[float], singular: float | None = None) -> list[float]:
    """`a` x = `b` by Gauss-Jordan elimination with partial pivoting. A column left without a pivot gets
    0; with `singular`, a pivot at most `singular` times `a`'s largest entry raises ValueError instead
    (columns that cannot be told apart)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    limit = 0.0 if singular is None else singular * max((abs(x) for row in a for x in row), default=0.0)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        if abs(m[col][col]) <= limit:
            if singular is not None:
                raise ValueError("singular equations: some columns cannot be told apart")
            continue
        for r in range(n):
            if r != col and m[r][col] != 0:
                factor = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= factor * m[col][c]
    return [m[i][n] / m[i][i] if m[i][i] != 0 else 0.0 for i in range(n)]
