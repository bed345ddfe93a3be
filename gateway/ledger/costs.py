"""From per-bucket counters to the cost table: paid GPU time, utilisation, effective cost per token.

Rules (the same for every store, so the in-memory and Redis ledgers print the same table):

- **Paid**: a backend costs `price_per_gpu_hour x gpus_per_backend` for every second it is in the pool
  (configured), busy, idle or failing health checks alike. The ledger stores those seconds per backend and
  bucket; USD is computed when read, from the configured price.
- **Split rule**: one output (decode) token is counted as `w` weighted tokens and one input (prefill)
  token as 1, where `w` is `ledger.output_token_weight` (default 4: decode is memory-bandwidth bound and
  runs one token per step, prefill processes the whole prompt in parallel). Cost per weighted token
  `c = spend / (input + w x output)`; input costs `c`, output `w x c` per token; blended is
  `spend / (input + output)`. For any window, input x in-rate + output x out-rate = spend.
- **Spend**: paid USD for backend, pool and vendor rows (paid = allocated + idle); for model, key and
  class rows (which own no GPU) the cost allocated to their requests, and an `(idle)` row with the rest
  (allocation rules: gateway/ledger/allocation.py).
- **Utilisation**: busy time / paid wall time, where a request's busy time is its duration divided by
  the requests in flight on its backend when it was sent (its time share); capped at 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from backends.models import Backend
from gateway.ledger.records import GPU_DIMENSIONS, CostRow, Dimension

WINDOWS: dict[str, int] = {"1m": 60, "15m": 900, "1h": 3600, "24h": 86400}
METRICS: tuple[str, ...] = ("req", "in", "out", "busy_us", "cost_nusd", "err", "est")
"""Counters kept per bucket and name: requests, tokens in/out, busy µs, estimated nano-USD (the sum of
the requests' `x-switchyard-cost-usd`), errors, requests whose usage was estimated."""
WEIGHTED, BOUND = "aw", "ab"
"""Allocation sums per bucket, field `<aw|ab>|<backend>|<rate bin>|<name>`: weighted tokens and bound
nano-USD (gateway/ledger/allocation.py)."""
PAID = "paid_ms"
"""Per backend and bucket: milliseconds of GPU time paid for."""

Counters = dict[str, int]


def bucket_of(timestamp: float, bucket_seconds: int) -> int:
    """The start (epoch seconds) of the bucket holding `timestamp`."""
    return int(timestamp // bucket_seconds) * bucket_seconds


def window_buckets(window: str, bucket_seconds: int, now: float) -> list[int]:
    """Bucket starts a window reads: the current (partial) bucket and the window's length before it."""
    if window not in WINDOWS:
        raise ValueError(f"unknown window {window!r}")
    current = bucket_of(now, bucket_seconds)
    count = -(-WINDOWS[window] // bucket_seconds)
    return [current - i * bucket_seconds for i in range(count, -1, -1)]


def record_values(
    prompt: int, completion: int, busy_s: float, cost_usd: float, error: bool, est: bool
) -> tuple[int, ...]:
    """The METRICS increments for one record, in order."""
    return (1, prompt, completion, round(busy_s * 1e6), round(cost_usd * 1e9), int(error), int(est))


def merge(into: dict[str, Counters], name: str, metric: str, value: int) -> None:
    counters = into.get(name)
    if counters is None:
        counters = into[name] = {}
    counters[metric] = counters.get(metric, 0) + value


IDLE_ROW = "(idle)"
"""The row of a model, key or class report that holds the cost no request used."""


def _group(by: Dimension, backend: Backend) -> str | None:
    if by == "backend":
        return backend.name
    if by == "pool":
        return backend.pool.name
    if by == "vendor":
        return backend.pool.vendor
    return None


def paid_nusd(paid_ms: int, backend: Backend) -> int:
    """Nano-USD for `paid_ms` of the backend's GPU time (price x GPUs), rounded once, deterministically."""
    return round(paid_ms * backend.pool.backend_price_per_second * 1e6)


def build_rows(
    by: Dimension,
    counters: Mapping[str, Counters],
    paid_ms: Mapping[str, int],
    backends: Iterable[Backend],
    output_weight: float,
    allocated: Mapping[str, int] | None = None,
    paid: Mapping[str, int] | None = None,
    idle: Mapping[str, int] | None = None,
) -> list[CostRow]:
    """One row per name seen in `counters` or owning paid GPU time, sorted by name.

    `allocated` is nano-USD by name of `by` and, for GPU rows, by backend; `paid` and `idle` nano-USD by
    backend (all summed over the window's buckets, gateway/ledger/allocation.py). For GPU rows
    paid = allocated + idle exactly; for the others an `(idle)` row holds the idle cost, so the rows of
    every report add up to the paid cost.
    """
    backends = list(backends)
    allocated = allocated or {}
    if paid is None:
        paid = {b.name: paid_nusd(paid_ms.get(b.name, 0), b) for b in backends}
    if idle is None:
        idle = {name: value - allocated.get(name, 0) for name, value in paid.items()}
    gpu_rows = by in GPU_DIMENSIONS
    paid_of: dict[str, int] = {}
    alloc_of: dict[str, int] = {} if gpu_rows else dict(allocated)
    idle_of: dict[str, int] = {}
    gpu_hours: dict[str, float] = {}
    wall_s: dict[str, float] = {}
    prices: dict[str, set[float]] = {}
    for backend in backends:
        group = _group(by, backend)
        name = backend.name
        if group is None:
            if idle.get(name):
                idle_of[IDLE_ROW] = idle_of.get(IDLE_ROW, 0) + idle[name]
            continue
        prices.setdefault(group, set()).add(backend.pool.price_per_gpu_hour)
        paid_of[group] = paid_of.get(group, 0) + paid.get(name, 0)
        alloc_of[group] = alloc_of.get(group, 0) + allocated.get(name, 0)
        idle_of[group] = idle_of.get(group, 0) + idle.get(name, 0)
        seconds = paid_ms.get(name, 0) / 1000.0
        if seconds <= 0:
            continue
        gpu_hours[group] = gpu_hours.get(group, 0.0) + seconds * backend.pool.gpus_per_backend / 3600.0
        wall_s[group] = wall_s.get(group, 0.0) + seconds
    names = set(counters) | {n for n, v in paid_of.items() if v} | {n for n, v in alloc_of.items() if v}
    if not gpu_rows and idle_of.get(IDLE_ROW):
        names.add(IDLE_ROW)
    rows: list[CostRow] = []
    for name in sorted(names):
        c = counters.get(name, {})
        prompt, completion = c.get("in", 0), c.get("out", 0)
        owns_gpus = name in prices
        row_paid = paid_of.get(name, 0) if owns_gpus else None
        row_alloc = alloc_of.get(name, 0)
        row_idle = idle_of.get(name, 0) if owns_gpus or name == IDLE_ROW else None
        spend = (row_paid if row_paid is not None else row_alloc + (row_idle or 0)) / 1e9
        price_set = prices.get(name, set())
        if len(price_set) == 1:
            price: float | None = next(iter(price_set))
        elif gpu_hours.get(name):
            price = paid_of[name] / 1e9 / gpu_hours[name]
        else:
            price = None
        wall = wall_s.get(name, 0.0)
        weighted = prompt + output_weight * completion
        per_weighted = spend / weighted if weighted > 0 and spend > 0 else None
        rows.append(
            CostRow(
                name=name,
                price_per_gpu_hour=price,
                gpu_hours=gpu_hours.get(name, 0.0) if owns_gpus else None,
                utilisation=min(1.0, c.get("busy_us", 0) / 1e6 / wall) if wall > 0 else None,
                requests=c.get("req", 0),
                prompt_tokens=prompt,
                completion_tokens=completion,
                paid_usd=row_paid / 1e9 if row_paid is not None else None,
                allocated_usd=row_alloc / 1e9,
                idle_usd=row_idle / 1e9 if row_idle is not None else None,
                spend_usd=spend,
                paid_nusd=row_paid,
                allocated_nusd=row_alloc,
                idle_nusd=row_idle,
                input_usd_per_mtok=per_weighted * 1e6 if per_weighted is not None else None,
                output_usd_per_mtok=per_weighted * output_weight * 1e6 if per_weighted is not None else None,
                blended_usd_per_mtok=spend / (prompt + completion) * 1e6
                if prompt + completion > 0 and spend > 0
                else None,
                usd_per_weighted_token=per_weighted,
            )
        )
    return rows


def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def format_cost_table(by: str, window: str, rows: Iterable[Mapping[str, Any]], idle_cost: str) -> str:
    """The table `GET /admin/v1/costs?format=text` and `switchyard costs` print (rows as JSON dicts)."""
    rows = list(rows)
    spread = "spread over the requests" if idle_cost == "spread" else "shown apart, charged to nobody"
    lines = [
        f"costs by {by}, window {window}; idle cost {spread} (ledger.idle_cost: {idle_cost})",
        f"{by:<24} {'$/GPU-h':>8} {'util':>6} {'requests':>9} {'tokens in':>11} {'tokens out':>11} "
        f"{'$/Mtok in':>10} {'$/Mtok out':>10} {'$/Mtok':>10} {'paid USD':>12} {'alloc USD':>12} "
        f"{'idle USD':>12}",
    ]
    for r in rows:
        util = r["utilisation"]
        lines.append(
            f"{r['name']!s:<24} {_num(r['price_per_gpu_hour'], '.2f'):>8} "
            f"{_num(util * 100, '.1f') + '%' if isinstance(util, float) else '-':>6} "
            f"{r['requests']:>9} {r['prompt_tokens']:>11} {r['completion_tokens']:>11} "
            f"{_num(r['input_usd_per_mtok'], '.4f'):>10} "
            f"{_num(r['output_usd_per_mtok'], '.4f'):>10} "
            f"{_num(r['blended_usd_per_mtok'], '.4f'):>10} {_num(r['paid_usd'], '.6f'):>12} "
            f"{_num(r['allocated_usd'], '.6f'):>12} {_num(r['idle_usd'], '.6f'):>12}"
        )
    paid = sum(int(r["paid_nusd"] or 0) for r in rows)
    if by in ("model", "key", "class"):
        paid = sum(int(r["allocated_nusd"]) + int(r["idle_nusd"] or 0) for r in rows)
    lines.append(f"{'total paid':<24} {paid / 1e9:.9f} USD (= allocated + idle)")
    return "\n".join(lines)
