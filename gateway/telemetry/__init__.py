"""Telemetry operators already read: Prometheus metrics, OpenTelemetry traces, a JSON access log.

- `metrics.py`: `GET /metrics`; per-request cells resolved once per label set, gauges read at scrape.
- `tracing.py`: one span per request, children for classify, route, each upstream attempt, account.
- `logs.py`: one JSON line per request with its request id, written off the request path.

The pipeline calls `Telemetry.recorded` once per ledger record and `Telemetry.failed` for errors of the
gateway's own; with metrics and the access log off, neither is wired in and the pipeline pays one `is None`
check per request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.telemetry.logs import AccessLog
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import RequestTrace, Tracing, build_tracing

if TYPE_CHECKING:
    from gateway.ledger.records import UsageRecord
    from gateway.request.parse import ParsedRequest

__all__ = ["AccessLog", "Metrics", "RequestTrace", "Telemetry", "Tracing", "build_tracing"]


class Telemetry:
    """What the request path feeds: metrics and the access log (either may be off)."""

    __slots__ = ("access_log", "metrics")

    def __init__(self, metrics: Metrics | None, access_log: AccessLog | None) -> None:
        self.metrics = metrics
        self.access_log = access_log

    def recorded(self, record: UsageRecord, parsed: ParsedRequest) -> None:
        if self.metrics is not None:
            self.metrics.record(record)
        log = self.access_log
        if log is not None:
            log.record(record, parsed.body if log.include_prompts else None)

    def failed(
        self,
        request_id: str,
        endpoint: str,
        status: int,
        code: str | int | None,
        message: str,
        body: bytes | None,
    ) -> None:
        if self.metrics is not None:
            self.metrics.error(endpoint, status, code)
        log = self.access_log
        if log is not None:
            text = None if code is None else str(code)
            log.error(request_id, endpoint, status, text, message, body if log.include_prompts else None)

    def close(self) -> None:
        if self.access_log is not None:
            self.access_log.close()
