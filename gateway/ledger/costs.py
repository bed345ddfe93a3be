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
- **Spend**: paid USD for backend, pool and vendor rows; for model and key rows (which own no GPU) the
  sum of the costs attributed to their requests.
- **Utilisation**: busy time / paid wall time, where a request's busy time is its duration divided by
  the requests in flight on its backend when it was sent (its time share); capped at 1.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from backends.models import Backend
from gateway.ledger.records import CostRow, Dimension

WINDOWS: dict[str, int] = {"1m": 60, "15m": 900, "1h": 3600, "24h": 86400}
METRICS: tuple[str, ...] = ("req", "in", "out", "busy_us", "cost_nusd", "err", "est")
"""Counters kept per bucket and name: requests, tokens in/out, busy µs, attributed nano-USD, errors,
requests whose usage was estimated."""
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


def record_values(prompt: int, completion: int, busy_s: float, cost_usd: float, error: bool, est: bool):
    """The METRICS increments for one record, in order."""
    return (1, prompt, completion, round(busy_s * 1e6), round(cost_usd * 1e9), int(error), int(est))


def merge(into: dict[str, Counters], name: str, metric: str, value: int) -> None:
    counters = into.get(name)
    if counters is None:
        counters = into[name] = {}
    counters[metric] = counters.get(metric, 0) + value


def _group(by: Dimension, backend: Backend) -> str | None:
    if by == "backend":
        return backend.name
    if by == "pool":
        return backend.pool.name
    if by == "vendor":
        return backend.pool.vendor
    return None


def build_rows(
    by: Dimension,
    counters: Mapping[str, Counters],
    paid_ms: Mapping[str, int],
    backends: Iterable[Backend],
    output_weight: float,
) -> list[CostRow]:
    """One row per name seen in `counters` or owning paid GPU time, sorted by name."""
    paid_usd: dict[str, float] = {}
    gpu_hours: dict[str, float] = {}
    wall_s: dict[str, float] = {}
    prices: dict[str, set[float]] = {}
    for backend in backends:
        group = _group(by, backend)
        if group is None:
            continue
        prices.setdefault(group, set()).add(backend.pool.price_per_gpu_hour)
        seconds = paid_ms.get(backend.name, 0) / 1000.0
        if seconds <= 0:
            continue
        paid_usd[group] = paid_usd.get(group, 0.0) + seconds * backend.pool.backend_price_per_second
        gpu_hours[group] = gpu_hours.get(group, 0.0) + seconds * backend.pool.gpus_per_backend / 3600.0
        wall_s[group] = wall_s.get(group, 0.0) + seconds
    rows: list[CostRow] = []
    for name in sorted(set(counters) | set(paid_usd)):
        c = counters.get(name, {})
        prompt, completion = c.get("in", 0), c.get("out", 0)
        attributed = c.get("cost_nusd", 0) / 1e9
        owns_gpus = name in prices
        paid = paid_usd.get(name, 0.0) if owns_gpus else None
        spend = paid if paid is not None else attributed
        price_set = prices.get(name, set())
        if len(price_set) == 1:
            price: float | None = next(iter(price_set))
        elif gpu_hours.get(name):
            price = paid_usd[name] / gpu_hours[name]
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
                paid_usd=paid,
                attributed_usd=attributed,
                spend_usd=spend,
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


def format_cost_table(by: str, window: str, rows: Iterable[Mapping[str, object]]) -> str:
    """The table `GET /admin/v1/costs?format=text` and `switchyard costs` print (rows as JSON dicts)."""
    lines = [
        f"costs by {by}, window {window} ($/Mtok in/out split: see gateway/ledger/costs.py)",
        f"{by:<24} {'$/GPU-h':>8} {'util':>6} {'requests':>9} {'tokens in':>11} {'tokens out':>11} "
        f"{'$/Mtok in':>10} {'$/Mtok out':>10} {'$/Mtok':>10} {'spend USD':>12}",
    ]
    for r in rows:
        util = r["utilisation"]
        lines.append(
            f"{r['name']!s:<24} {_num(r['price_per_gpu_hour'], '.2f'):>8} "  # type: ignore[arg-type]
            f"{_num(util * 100, '.1f') + '%' if isinstance(util, float) else '-':>6} "
            f"{r['requests']:>9} {r['prompt_tokens']:>11} {r['completion_tokens']:>11} "
            f"{_num(r['input_usd_per_mtok'], '.4f'):>10} "  # type: ignore[arg-type]
            f"{_num(r['output_usd_per_mtok'], '.4f'):>10} "  # type: ignore[arg-type]
            f"{_num(r['blended_usd_per_mtok'], '.4f'):>10} {_num(r['spend_usd'], '.6f'):>12}"  # type: ignore[arg-type]
        )
    return "\n".join(lines)
