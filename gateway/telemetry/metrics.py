"""Prometheus metrics: `GET /metrics` in the text exposition format, written by hand.

Per request the gateway touches pre-resolved cells only: one dict lookup of a label tuple (resolved the
first time it is seen, then cached), a few integer and float increments, and one `bisect` per histogram.
Everything that describes state rather than traffic (backend health, breaker state, scraped engine load,
in-flight requests, routing decision time, the ledger's buffer) is read when Prometheus scrapes, never on
the request path.

Label sets are bounded: model (only models the catalog serves reach a backend), class and route (named
by the policy), pool, vendor, backend (from the config file), status, and error codes (the gateway's own
fixed set). No request ids, keys or user text.
"""

from __future__ import annotations

import re
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

from backends.models import Backend
from gateway.ledger.records import Ledger, UsageRecord
from gateway.telemetry.tracing import Tracing

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

MAX_ERROR_SERIES = 256
_CODE = re.compile(r"^[a-z0-9_]{0,48}$")
_REQUEST_LABELS = ("model", "class", "route", "pool", "vendor")


class GatewayState(Protocol):
    """What a scrape reads of the request path as it is now (gateway/request/pipeline.py `Pipeline`)."""

    @property
    def router(self) -> object:
        """The policy serving now (a `PolicyEngine` counts its decisions)."""

    @property
    def queued(self) -> int:
        """Requests waiting for room (back-pressure)."""

    @property
    def tracing(self) -> object | None:
        """The tracer now wired in (its span shipper counts what it shipped)."""


_BREAKER_STATES = ("closed", "half-open", "open")


class Histogram:
    """Fixed buckets; `counts[i]` holds observations in (bounds[i-1], bounds[i]], the last one +Inf."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str) -> Iterable[str]:
        running = 0
        sep = "," if labels else ""
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            yield f'{name}_bucket{{{labels}{sep}le="{bound:g}"}} {running}'
        yield f'{name}_bucket{{{labels}{sep}le="+Inf"}} {self.count}'
        yield f"{name}_sum{{{labels}}} {_num(self.sum)}"
        yield f"{name}_count{{{labels}}} {self.count}"


class _Series:
    """The cells one (model, class, route, pool, vendor) combination updates."""

    __slots__ = ("by_status", "e2e", "labels", "tpot", "ttft")

    def __init__(self, labels: str) -> None:
        self.labels = labels
        self.by_status: dict[int, int] = {}
        self.ttft = Histogram(LATENCY_BUCKETS)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.e2e = Histogram(LATENCY_BUCKETS)


class _BackendCells:
    __slots__ = ("completion_tokens", "cost_usd", "prompt_tokens", "requests")

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cost_usd = 0.0
        self.requests = 0


class Metrics:
    """The gateway's Prometheus registry: request cells fed per request, gauges read at scrape time."""

    def __init__(
        self,
        backends: Sequence[Backend],
        ledger: Ledger | None = None,
    ) -> None:
        self._backends = list(backends)
        self._by_backend = {b.name: (b, _BackendCells()) for b in self._backends}
        self._series: dict[tuple[str, str, str, str, str], _Series] = {}
        self._errors: dict[tuple[str, int, str], int] = {}
        self._ledger = ledger
        self.started = time.time()

    # --- the request path -------------------------------------------------------------------------------

    def record(self, record: UsageRecord) -> None:
        """Count one finished request (called once per ledger record)."""
        key = (record.model, record.request_class, record.route, record.pool, record.vendor)
        series = self._series.get(key)
        if series is None:
            series = self._new_series(key, record)
        by_status = series.by_status
        status = record.status
        by_status[status] = by_status.get(status, 0) + 1
        duration = record.duration_s
        series.e2e.observe(duration)
        tokens = record.completion_tokens
        if record.stream and record.ttft_s is not None:
            series.ttft.observe(record.ttft_s)
            if tokens > 1:
                series.tpot.observe((duration - record.ttft_s) / (tokens - 1))
        cells = self._by_backend.get(record.backend)
        if cells is not None:
            c = cells[1]
            c.requests += 1
            c.prompt_tokens += record.prompt_tokens
            c.completion_tokens += tokens
            c.cost_usd += record.cost_usd

    def _new_series(self, key: tuple[str, str, str, str, str], record: UsageRecord) -> _Series:
        labels = ",".join(f'{n}="{_escape(v)}"' for n, v in zip(_REQUEST_LABELS, key, strict=True))
        series = self._series[key] = _Series(labels)
        return series

    def error(self, endpoint: str, status: int, code: str | int | None) -> None:
        """A request the gateway answered with an error of its own (no backend answer to account).

        Codes come from the gateway's fixed set or a backend's 4xx; anything unusual counts as `other`,
        and past `MAX_ERROR_SERIES` series everything new does, so the label set stays bounded.
        """
        label = "" if code is None else str(code)
        if not _CODE.match(label):
            label = "other"
        key = (endpoint, status, label)
        errors = self._errors
        if key not in errors and len(errors) >= MAX_ERROR_SERIES:
            key = (endpoint, status, "other")
        errors[key] = errors.get(key, 0) + 1

    # --- the scrape -------------------------------------------------------------------------------------

    def render(self, gateway: GatewayState | None = None) -> bytes:
        """The text Prometheus scrapes; with `gateway`, its routing, back-pressure and tracing gauges too.
        Counts only the records handed to `record`: a scrape flushes the telemetry's batch first."""
        out: list[str] = []
        add = out.append

        def head(name: str, kind: str, text: str) -> None:
            add(f"# HELP {name} {text}")
            add(f"# TYPE {name} {kind}")

        series = sorted(self._series.values(), key=lambda s: s.labels)
        head("switchyard_requests_total", "counter", "Requests answered by a backend, by final status.")
        for s in series:
            for status, n in sorted(s.by_status.items()):
                add(f'switchyard_requests_total{{{s.labels},status="{status}"}} {n}')
        head(
            "switchyard_request_errors_total",
            "counter",
            "Requests the gateway refused or failed itself (bad input, no backend, upstream failures).",
        )
        for (endpoint, status, code), n in sorted(self._errors.items()):
            labels = f'endpoint="{endpoint}",status="{status}",code="{code}"'
            add(f"switchyard_request_errors_total{{{labels}}} {n}")
        for attr, name, text in (
            ("e2e", "switchyard_request_duration_seconds", "Answering backend: sent to last byte."),
            ("ttft", "switchyard_time_to_first_token_seconds", "Streams: time to the first chunk."),
            ("tpot", "switchyard_time_per_output_token_seconds", "Streams: decode time per output token."),
        ):
            head(name, "histogram", text)
            for s in series:
                out.extend(getattr(s, attr).lines(name, s.labels))
        cells = [(b, c) for b, c in self._by_backend.values()]
        for attr, name, text in (
            ("requests", "switchyard_backend_requests_total", "Requests answered."),
            ("prompt_tokens", "switchyard_backend_prompt_tokens_total", "Prompt tokens."),
            ("completion_tokens", "switchyard_backend_completion_tokens_total", "Output tokens."),
            (
                "cost_usd",
                "switchyard_backend_cost_usd_total",
                "Estimated cost in USD (sum of x-switchyard-cost-usd; settled costs: *_usd_per_hour).",
            ),
        ):
            head(name, "counter", text)
            for b, c in cells:
                add(f"{name}{{{_backend_labels(b)}}} {_num(getattr(c, attr))}")
        self._render_backends(head, add)
        self._render_costs(head, add)
        self._render_gateway(head, add, gateway)
        add("")
        return "\n".join(out).encode()

    def _render_backends(self, head: Callable[[str, str, str], None], add: Callable[[str], None]) -> None:
        now = time.monotonic()
        gauges: list[tuple[str, str, Callable[[Backend], float]]] = [
            ("up", "Health checks pass (1) or not (0).", lambda b: b.health_ok),
            ("routable", "Routing may send it requests.", lambda b: b.healthy),
            ("draining", "Drained by an operator.", lambda b: b.draining),
            ("inflight_requests", "Requests in flight from this gateway.", lambda b: b.inflight),
            ("running_requests", "vLLM num_requests_running, scraped.", lambda b: b.load.running),
            ("waiting_requests", "vLLM num_requests_waiting, scraped.", lambda b: b.load.waiting),
            ("kv_cache_usage_ratio", "vLLM KV-cache usage, scraped.", lambda b: b.load.kv_cache_usage),
            (
                "load_age_seconds",
                "Seconds since the backend's /metrics was last read (-1: never).",
                lambda b: -1.0 if b.load.scraped_at is None else now - b.load.scraped_at,
            ),
        ]
        for suffix, text, read in gauges:
            name = "switchyard_backend_" + suffix
            head(name, "gauge", text)
            for b in self._backends:
                add(f"{name}{{{_backend_labels(b)}}} {_num(float(read(b)))}")
        head("switchyard_backend_breaker_state", "gauge", "Circuit breaker state: 1 for the current one.")
        for b in self._backends:
            for state in _BREAKER_STATES:
                value = 1 if b.breaker.state == state else 0
                add(f'switchyard_backend_breaker_state{{{_backend_labels(b)},state="{state}"}} {value}')
        head(
            "switchyard_profile_error_ratio",
            "gauge",
            "Measured TTFT or TPOT over its pool profile's prediction (averaged; 1 is exact).",
        )
        for b in self._backends:
            for metric, drift in b.drift.metrics.items():
                if drift.ratio is not None:
                    labels = f'{_backend_labels(b)},metric="{metric}"'
                    add(f"switchyard_profile_error_ratio{{{labels}}} {_num(drift.ratio)}")
        head("switchyard_backend_breaker_opened_total", "counter", "Times the circuit breaker opened.")
        for b in self._backends:
            add(f"switchyard_backend_breaker_opened_total{{{_backend_labels(b)}}} {b.breaker.opened}")

    def _render_costs(self, head: Callable[[str, str, str], None], add: Callable[[str], None]) -> None:
        """Paid, allocated and idle USD per hour of each backend over the ledger's last 15 minutes, as the
        last refresh read them from the ledger: on a shared Redis every replica reports the same values."""
        if self._ledger is None:
            return
        rows = {row.name: row for row in getattr(self._ledger, "window_rows", ())}
        for kind, text in (
            ("paid", "GPU cost paid"),
            ("allocated", "Paid cost allocated to requests"),
            ("idle", "Paid cost no request used"),
        ):
            name = f"switchyard_backend_{kind}_usd_per_hour"
            head(name, "gauge", f"{text}, USD per hour over the last 15 minutes (the same on every replica).")
            for b in self._backends:
                row = rows.get(b.name)
                wall_hours = row.gpu_hours / b.pool.gpus_per_backend if row and row.gpu_hours else 0.0
                nusd = getattr(row, f"{kind}_nusd", 0) or 0 if row is not None else 0
                add(f"{name}{{{_backend_labels(b)}}} {_num(nusd / 1e9 / wall_hours if wall_hours else 0.0)}")
        mode = getattr(self._ledger, "idle_cost", "idle")
        head("switchyard_ledger_idle_cost_info", "gauge", "How idle cost is reported (ledger.idle_cost).")
        add(f'switchyard_ledger_idle_cost_info{{mode="{mode}"}} 1')

    def _render_gateway(
        self, head: Callable[[str, str, str], None], add: Callable[[str], None], gateway: GatewayState | None
    ) -> None:
        router = gateway.router if gateway is not None else None
        decisions = getattr(router, "decisions", None)  # a PolicyEngine's counters; other routers keep none
        decision_ns = getattr(router, "decision_ns", None)
        if decisions is not None and decision_ns is not None:
            head(
                "switchyard_routing_decision_seconds",
                "summary",
                "Time the routing policy spent choosing (since the policy was last loaded).",
            )
            add(f"switchyard_routing_decision_seconds_sum {_num(decision_ns / 1e9)}")
            add(f"switchyard_routing_decision_seconds_count {decisions}")
        if gateway is not None:
            head("switchyard_queued_requests", "gauge", "Requests waiting for room (back-pressure).")
            add(f"switchyard_queued_requests {gateway.queued}")
        if self._ledger is not None:
            stats = self._ledger.stats()
            head("switchyard_ledger_buffered_records", "gauge", "Usage records waiting to be written.")
            store = stats.get("store")
            add(f'switchyard_ledger_buffered_records{{store="{store}"}} {stats.get("buffered") or 0}')
            for key, name in (
                ("dropped", "switchyard_ledger_dropped_records_total"),
                ("flush_errors", "switchyard_ledger_flush_errors_total"),
                ("background_errors", "switchyard_ledger_background_errors_total"),
            ):
                head(name, "counter", f"Ledger {key.replace('_', ' ')}.")
                add(f"{name} {stats.get(key) or 0}")
        tracing = gateway.tracing if gateway is not None else None
        spans = tracing.shipper.stats() if isinstance(tracing, Tracing) else None
        if spans is not None:
            for key, name, kind, text in (
                (
                    "exported",
                    "switchyard_trace_spans_exported_total",
                    "counter",
                    "Spans handed to the exporter.",
                ),
                (
                    "dropped",
                    "switchyard_trace_spans_dropped_total",
                    "counter",
                    "Spans dropped (queue full or exporter gone).",
                ),
                (
                    "queued",
                    "switchyard_trace_traces_queued",
                    "gauge",
                    "Finished traces waiting to be shipped.",
                ),
            ):
                head(name, kind, text)
                add(f"{name} {spans[key]}")
        head("switchyard_start_time_seconds", "gauge", "Unix time the gateway started.")
        add(f"switchyard_start_time_seconds {self.started:.3f}")


def _backend_labels(b: Backend) -> str:
    return f'backend="{_escape(b.name)}",pool="{_escape(b.pool.name)}",vendor="{b.pool.vendor}"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _num(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return repr(value)
