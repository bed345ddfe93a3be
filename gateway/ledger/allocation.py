"""Cost allocation: per bucket and backend, paid = allocated + idle, in integer nano-USD.

As OpenCost and Kubecost allocate a node's cost to workloads and show the rest as idle:

- **Paid** `P`: the backend's GPU time in the bucket at its configured price (gateway/ledger/costs.py).
- **Share**: a request served `w` weighted tokens (input + `output_token_weight` x output); the backend
  served `W` in the bucket. Its fair share is `P x w / W`.
- **Bound**: a request is never allocated more than its time on the backend costs:
  `bound = price x GPUs x duration` (`UsageRecord.bound_nusd`). So a request is allocated
  `min(P x w / W, bound) = w x min(rho, kappa)` with `rho = P / W` and `kappa = bound / w`, its highest
  rate per weighted token.
- **Idle** = P - allocated: time nobody used is not charged to whoever happened to arrive. With
  `ledger.idle_cost: spread` the idle cost of a bucket is spread over its requests by weighted tokens
  (then a request may be charged above its bound; the report says which mode is in force).

`rho` is known only at the bucket's end, so the stores keep, per bucket, backend, name and *rate bin*
the sums of `w` and `bound` (never one row per request), and this module allocates when a report is
read. A rate bin holds the requests whose `kappa` lies in `[q/8, (q+1)/8) x 2^e` (bin = 8e + q,
q in 4..7: eight bins per octave, 9% to 25% wide). For a bin entirely below `rho` every request gets its
bound (the sum of bounds, exact); entirely above, its fair share (exact); the one bin straddling `rho`
gets `w x kappa_low`, at most one bin's width below the ideal and never above any request's bound. All
arithmetic is on integers, each part rounded down, and idle takes the remainder: conservation is exact
by construction, for every backend and for the sums by any dimension.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

Share = tuple[str, int, str, int, int]
"""(backend, rate bin, name, weighted tokens, bound nano-USD): sums over one bucket."""

IDLE_MODES = ("idle", "spread")


def _scaled_le(q: int, shift: int, w: int, value: int) -> bool:
    """q x 2^shift x w <= value, exactly."""
    return (q * w << shift) <= value if shift >= 0 else q * w <= (value << -shift)


def _next(rate_bin: int) -> int:
    return rate_bin + 1 if rate_bin % 8 != 7 else rate_bin + 5


def _prev(rate_bin: int) -> int:
    return rate_bin - 1 if rate_bin % 8 != 4 else rate_bin - 5


def _low_le(rate_bin: int, w: int, value: int) -> bool:
    """kappa_low(rate_bin) x w <= value."""
    return _scaled_le(rate_bin % 8, rate_bin // 8 - 3, w, value)


def rate_bin(bound_nusd: int, weighted: int) -> int:
    """The bin of `bound / weighted` (see the module docstring); 0 when the request has no weight.

    Exact, on integers: `bound / weighted` lies in [2^(e-2), 2^e) for the `e` below, so
    q = floor(8 x kappa / 2^e) is in 2..7; below 4, the bin is one octave down.
    """
    if weighted <= 0 or bound_nusd <= 0:
        return 0
    exponent = bound_nusd.bit_length() - weighted.bit_length() + 1
    shift = 3 - exponent
    q = (bound_nusd << shift) // weighted if shift >= 0 else bound_nusd // (weighted << -shift)
    if q < 4:
        exponent -= 1
        shift += 1
        q = (bound_nusd << shift) // weighted if shift >= 0 else bound_nusd // (weighted << -shift)
    return exponent * 8 + q


def _part(paid: int, total: int, rate_bin: int, w: int, bound: int) -> int:
    """Nano-USD allocated to one (backend, bin, name) sum of `w` weighted tokens and `bound`."""
    fair = paid * w // total
    if not rate_bin or _low_le(_next(rate_bin), total, paid):  # every kappa in the bin is below rho
        return min(bound, fair)
    q, shift = rate_bin % 8, rate_bin // 8 - 3
    low = (q * w << shift) if shift >= 0 else (q * w) >> -shift
    return min(low, fair)


def allocate_bucket(
    paid_nusd: Mapping[str, int], shares: Iterable[Share], spread_idle: bool = False
) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """One bucket: (allocated by name, allocated by backend, idle by backend), all nano-USD.

    For every backend in `paid_nusd`: allocated + idle == paid. Backends with shares but no paid time
    (not configured, or no time claimed yet) are allocated nothing.
    """
    shares = list(shares)
    total: dict[str, int] = {}
    for backend, _, _, w, _ in shares:
        total[backend] = total.get(backend, 0) + w
    by_name: dict[str, int] = {}
    by_backend: dict[str, int] = {}
    weight_of: dict[str, dict[str, int]] = {}
    for backend, rbin, name, w, bound in shares:
        paid = paid_nusd.get(backend, 0)
        if w <= 0 or paid <= 0:
            continue
        part = _part(paid, total[backend], rbin, w, bound)
        by_name[name] = by_name.get(name, 0) + part
        by_backend[backend] = by_backend.get(backend, 0) + part
        if spread_idle:
            names = weight_of.setdefault(backend, {})
            names[name] = names.get(name, 0) + w
    idle = {backend: paid - by_backend.get(backend, 0) for backend, paid in paid_nusd.items()}
    if spread_idle:
        for backend, names in weight_of.items():
            for name, part in spread(idle[backend], names).items():
                by_name[name] = by_name.get(name, 0) + part
            by_backend[backend] = by_backend.get(backend, 0) + idle[backend]
            idle[backend] = 0
    return by_name, by_backend, idle


def spread(amount: int, weights: Mapping[str, int]) -> dict[str, int]:
    """Split `amount` in proportion to `weights` with the largest-remainder method (ties by name)."""
    total = sum(weights.values())
    if total <= 0 or amount <= 0:
        return {}
    parts = {name: amount * w // total for name, w in weights.items()}
    left = amount - sum(parts.values())
    by_remainder = sorted(weights, key=lambda name: (-(amount * weights[name] % total), name))
    for name in by_remainder[:left]:
        parts[name] += 1
    return parts


def request_allocation(paid: int, total: int, weighted: int, bound: int) -> float:
    """What one request is allocated in a bucket (nano-USD, before rounding down): for tests and docs."""
    if weighted <= 0 or paid <= 0:
        return 0.0
    rbin = rate_bin(bound, weighted)
    fair = paid * weighted / total
    if not rbin or _low_le(_next(rbin), total, paid):
        return float(min(bound, fair))
    return min(math.ldexp(rbin % 8, rbin // 8 - 3) * weighted, fair)
