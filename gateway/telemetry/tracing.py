"""OpenTelemetry traces: one server span per request, with a child span per step.

    chat llama-3.1-8b                  SERVER  gen_ai.* and switchyard.* attributes, the final status
    ├── classify                               parse + the facts routing reads
    ├── route                                  the policy's decision (and any back-pressure wait)
    ├── upstream                       CLIENT  one per attempt: backend, status, error; a retried
    ├── upstream                       CLIENT  request has several
    └── account                                the ledger record and attributed cost

An incoming W3C `traceparent` (and `tracestate`) makes the request span its child, sampled as the caller
decided; each attempt sends the backend its own span's context, so vLLM's spans hang under the attempt.
Without one, `sample_ratio` decides, exactly as the SDK's `ParentBased(TraceIdRatioBased(ratio))`.

The request path makes no SDK object and no span: a request keeps references and timestamps, and when
it ends one flat msgpack tuple goes to a `SpanShipper`. The event loop writes batches of them to the
span-export child process (gateway/telemetry/span_export.py), which builds the spans and runs the OTLP
exporter on another core (or, with an exporter object passed in, a thread builds and exports them in
process: tests). An unsampled request records nothing and still passes its context (flags 00) to the
backend. With tracing off, nothing here runs: the pipeline checks one attribute.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from random import getrandbits
from time import time_ns
from typing import IO, TYPE_CHECKING, Any

import msgspec

from gateway.telemetry.batch_timer import BatchTimer
from gateway.telemetry.span_export import frame, to_readable_spans

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from backends.models import Backend
    from gateway.ledger.records import UsageRecord
    from gateway.request.classify import Caller
    from gateway.settings import Tracing as TracingOptions
    from policies.framework import Decision
    from policies.profile import RequestProfile

log = logging.getLogger("switchyard.telemetry")

_MASK64 = (1 << 64) - 1
_encode = msgspec.msgpack.Encoder().encode
"""A finished trace is encoded at once: its objects die young instead of lingering until the next batch
(measured: keeping the records for the batch and encoding them together costs more, in the GC)."""


class Parent(msgspec.Struct, frozen=True):
    """The caller's span, from a W3C `traceparent` (`00-<trace>-<span>-<flags>`)."""

    trace_id: int
    span_id: int
    sampled: bool
    tracestate: str | None = None


def parent_context(forwarded: dict[str, str]) -> Parent | None:
    """The caller's trace context, or None when there is none or it is malformed."""
    header = forwarded.get("traceparent")
    if header is None:
        return None
    parts = header.strip().split("-")
    if len(parts) != 4 or len(parts[1]) != 32 or len(parts[2]) != 16 or parts[0] == "ff":
        return None
    try:
        trace_id, span_id, flags = int(parts[1], 16), int(parts[2], 16), int(parts[3][:2], 16)
    except ValueError:
        return None
    if not trace_id or not span_id:
        return None
    return Parent(trace_id, span_id, bool(flags & 1), forwarded.get("tracestate"))


class Tracing:
    """Starts request traces and owns where finished ones go."""

    __slots__ = ("_bound", "shipper")

    def __init__(self, shipper: SpanShipper, sample_ratio: float = 1.0) -> None:
        self.shipper = shipper
        self._bound = round(sample_ratio * (1 << 64))
        """TraceIdRatioBased: sampled when the trace id's low 64 bits are below this."""

    def start(self, endpoint: str, caller: Caller) -> RequestTrace | None:
        """The request's trace when sampled; otherwise None, after giving the backend an unsampled context.

        A sampled request's attempts each send their own `traceparent` (so the caller's is taken out of
        `caller.forwarded`); an unsampled one records nothing and passes the caller's context on as it
        came (or, without a valid one, a new context flagged not sampled), so the backend does not trace
        what the gateway left out.
        """
        forwarded = caller.forwarded
        parent = parent_context(forwarded) if "traceparent" in forwarded else None
        if parent is not None:
            trace_id, sampled = parent.trace_id, parent.sampled
        else:
            trace_id = getrandbits(128) or 1
            sampled = (trace_id & _MASK64) < self._bound
            forwarded.pop("tracestate", None)  # meaningless without a valid traceparent
        if sampled:
            forwarded.pop("traceparent", None)
            return RequestTrace(self.shipper, trace_id, parent, endpoint, caller.request_id)
        if parent is None:
            forwarded["traceparent"] = "00-%032x-%016x-00" % (trace_id, getrandbits(64) or 1)  # noqa: UP031 - twice as fast as an f-string
        return None

    def force_flush(self, timeout: float = 5.0) -> bool:
        return self.shipper.flush(timeout)

    def shutdown(self) -> None:
        self.shipper.close()


def build_tracing(options: TracingOptions, exporter: SpanExporter | None = None) -> Tracing | None:
    """Tracing as configured (None when off); `exporter` exports in-process instead of a child (tests)."""
    if exporter is not None:
        shipper: SpanShipper = InProcessShipper(exporter, options.service_name, options.max_queue)
    elif not options.enabled:
        return None
    else:
        shipper = ChildProcessShipper(_child_settings(options), options.max_queue)
    shipper.start()
    return Tracing(shipper, options.sample_ratio if exporter is None or options.enabled else 1.0)


def _child_settings(options: TracingOptions) -> dict[str, Any]:
    return {
        "exporter": options.exporter,
        "protocol": options.protocol,
        "endpoint": options.endpoint,
        "headers": dict(options.headers),
        "service_name": options.service_name,
    }


class RequestTrace:
    """One sampled request: what happened, as references and timestamps until the request ends.

    The pipeline stores the step timestamps, profile and decision straight into the slots (no call per
    step); the spans and their attributes are built by the span-export process from one flat tuple per
    request (gateway/telemetry/span_export.py), so the request path makes no dict, no span and no id but
    the ones the backend must see.
    """

    __slots__ = (
        "_attempt",
        "_parent",
        "_shipper",
        "attempts",
        "classified_ns",
        "decision",
        "ended",
        "endpoint",
        "profile",
        "request_id",
        "root_id",
        "routed_ns",
        "start_ns",
        "trace_id",
    )

    def __init__(
        self,
        shipper: SpanShipper,
        trace_id: int,
        parent: Parent | None,
        endpoint: str,
        request_id: str,
    ) -> None:
        self._shipper = shipper
        self.trace_id = trace_id
        self._parent = parent
        self.endpoint = endpoint
        self.request_id = request_id
        self.root_id = getrandbits(64) or 1
        self.start_ns = time_ns()
        """Also where parsing starts: the classify span runs from here to `classified_ns`, the route
        span from there to `routed_ns` (both set by the pipeline, which sets `profile` and `decision`
        with them, so they are read only once set)."""
        self.ended = False
        self.profile: RequestProfile | None = None
        self.decision: Decision | None = None
        self.attempts: list[tuple[Any, ...]] = []
        self._attempt: tuple[int, int, Backend, int] | None = None

    # --- upstream attempts (gateway/request/forward.py), one at a time -------------------------------------

    def attempt(self, backend: Backend, number: int) -> bytes:
        """Open a client span for an attempt; returns the `traceparent` header line the backend gets."""
        span_id = getrandbits(64) or 1
        self._attempt = (span_id, time_ns(), backend, number)
        return b"traceparent: 00-%032x-%016x-01\r\n" % (self.trace_id, span_id)

    def attempt_done(self, status: int | None, error: str | None = None) -> None:
        """Close the open attempt's span with the backend's status, or the error that ended it."""
        opened = self._attempt
        if opened is None:
            return
        self._attempt = None
        span_id, start_ns, b, number = opened
        self.attempts.append(
            (span_id, start_ns, time_ns(), number, b.name, b.pool.name, b.pool.vendor, b.url, status, error)
        )

    def finish(self, record: UsageRecord, account_start_ns: int, account_end_ns: int, attempts: int) -> None:
        """The request was accounted: its usage and cost go on the request span, which ends."""
        if self.ended:
            return
        r = record
        result = (
            r.model, r.prompt_tokens, r.completion_tokens, r.status, r.vendor, r.pool, r.backend,
            r.accelerator, r.cost_usd, attempts, r.ttft_s if r.stream else None,
            account_start_ns, account_end_ns, r.usage_source,
        )  # fmt: skip
        self._end(result, None)

    def fail(self, status: int, code: str | None, message: str) -> None:
        """The request ended in an error of the gateway's (no backend answer to account)."""
        if self.ended:
            return
        self._end(None, (status, code, message))

    def _end(self, result: tuple[Any, ...] | None, failure: tuple[int, str | None, str] | None) -> None:
        self.ended = True
        parent = self._parent
        trace_id = self.trace_id
        p = self.profile
        profile = classify = None
        if p is not None:
            profile = (p.model, p.max_tokens, p.n, p.stream, p.prompt_tokens_estimate)
            classify = (self.start_ns, self.classified_ns)
        d = self.decision
        routed = None
        if d is not None:
            routed = (
                self.classified_ns,
                self.routed_ns,
                d.request_class,
                d.route,
                [b.name for b in d.candidates],
            )
        attempts = self.attempts
        spans = 1 + len(attempts) + (p is not None) + (d is not None) + (result is not None)
        self._shipper.submit(
            _encode(
                (
                    trace_id >> 64,
                    trace_id & _MASK64,
                    parent.span_id if parent is not None else 0,
                    parent.tracestate if parent is not None else None,
                    self.root_id,
                    self.endpoint,
                    self.request_id,
                    self.start_ns,
                    time_ns(),
                    profile,
                    classify,
                    routed,
                    attempts,
                    result,
                    failure,
                )
            ),
            spans,
        )


# --- where finished traces go -------------------------------------------------------------------------


class SpanShipper:
    """Collects finished traces; a daemon thread hands them on in batches every `interval` seconds.

    `submit` runs on the event loop and only appends a trace's msgpack bytes to a list (bounded by
    `max_queue` traces: beyond it traces are dropped and counted, never waited for).
    """

    interval = 0.2
    batch_wake = 512

    def __init__(self, max_queue: int) -> None:
        self.max_queue = max_queue
        self._pending: deque[tuple[bytes, int]] = deque()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.submitted_spans = 0
        self.exported_spans = 0
        self.dropped_spans = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="switchyard-spans", daemon=True)
        self._thread.start()

    def submit(self, encoded: bytes, spans: int) -> None:
        pending = self._pending
        if len(pending) >= self.max_queue:
            self.dropped_spans += spans
            return
        pending.append((encoded, spans))
        self.submitted_spans += spans
        if len(pending) == self.batch_wake:
            self._wake.set()

    def _run(self) -> None:
        while not self._stopping:
            self._wake.wait(self.interval)
            self._wake.clear()
            self._drain()

    def _drain(self) -> None:
        with self._lock:
            pending = self._pending  # the event loop appends while this thread pops: both are atomic
            batch = [pending.popleft() for _ in range(len(pending))]
            if batch:
                spans = sum(n for _, n in batch)
                if self._ship(batch):
                    self.exported_spans += spans
                else:
                    self.dropped_spans += spans

    def flush(self, timeout: float = 5.0) -> bool:
        """Hand on everything submitted so far (from any thread but the event loop's, or at shutdown)."""
        deadline = time.monotonic() + timeout
        while not self._lock.acquire(timeout=0.05):
            if time.monotonic() > deadline:
                return False
        self._lock.release()
        self._drain()
        return True

    def close(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._drain()
        self._stop()

    def stats(self) -> dict[str, int]:
        return {
            "submitted": self.submitted_spans,
            "exported": self.exported_spans,
            "dropped": self.dropped_spans,
            "queued": len(self._pending),
        }

    def _ship(self, batch: list[tuple[bytes, int]]) -> bool:
        raise NotImplementedError

    def _stop(self) -> None:
        return None


class InProcessShipper(SpanShipper):
    """Builds SDK spans and calls `exporter` in the shipping thread (tests: `InMemorySpanExporter`)."""

    def __init__(self, exporter: SpanExporter, service_name: str, max_queue: int) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        super().__init__(max_queue)
        self.exporter = exporter
        self._decode = msgspec.msgpack.Decoder().decode
        self._resource = Resource.create({"service.name": service_name})
        self._scope = InstrumentationScope("switchyard")

    def _ship(self, batch: list[tuple[bytes, int]]) -> bool:
        from opentelemetry.sdk.trace.export import SpanExportResult

        records = [self._decode(encoded) for encoded, _ in batch]
        spans = to_readable_spans(records, self._resource, self._scope)
        try:
            return self.exporter.export(spans) is SpanExportResult.SUCCESS
        except Exception as exc:
            log.warning("span export failed: %s", exc)
            return False


class ChildProcessShipper(SpanShipper):
    """Writes msgpack batches to the span-export child (gateway/telemetry/span_export.py).

    No thread: a thread blocked on the pipe wakes for every chunk the child reads and takes the GIL from
    the event loop each time (measured: half the gateway's throughput). Instead the event loop itself
    encodes what finished every `interval` and writes it to the non-blocking pipe, keeping what the pipe
    cannot take in a buffer (at most `max_buffer` bytes; a batch past that is dropped and counted). A
    child that died is restarted (at most every `restart_pause` seconds) and the batch it missed counted
    as dropped. Outside an event loop (tests, shutdown) `flush` writes synchronously.
    """

    interval = 0.05
    restart_pause = 5.0
    max_buffer = 32 * 1024 * 1024

    def __init__(self, settings: dict[str, Any], max_queue: int) -> None:
        super().__init__(max_queue)
        self._settings = msgspec.msgpack.encode(settings)
        self.process: subprocess.Popen[bytes] | None = None
        self._fd = -1
        self._out = bytearray()
        self._out_spans: list[int] = []
        """Spans per frame still (partly) in `_out`, oldest first: counted exported once written."""
        self._out_sizes: list[int] = []
        self._writing = False
        self._timer = BatchTimer(self.interval, self._drain)
        self._started_at = 0.0
        self.restarts = 0
        self._traces: list[bytes] = []
        self._traces_spans = 0

    def start(self) -> None:
        self._spawn()

    def _spawn(self) -> None:
        self._started_at = time.monotonic()
        self._out.clear()
        self._out_spans.clear()
        self._out_sizes.clear()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from gateway.telemetry.span_export import main; raise SystemExit(main())",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            # Its own session: with the kernel's autogroup scheduling a busy exporter then counts as its
            # own group, not against the gateway's share of a CPU. It exits at the end of its stdin.
            start_new_session=True,
        )
        stdin: IO[bytes] = self.process.stdin  # type: ignore[assignment]
        stdin.write(frame(self._settings))
        stdin.flush()
        self._fd = stdin.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._fd, 1031, 1 << 20)  # F_SETPIPE_SZ: fewer, larger writes
        os.set_blocking(self._fd, False)

    def submit(self, encoded: bytes, spans: int) -> None:
        # Its own queue, not the base class's: a list of encoded traces and one span count, swapped out
        # whole by `_drain` (both run on the event loop, so nothing is shared with a thread).
        traces = self._traces
        if len(traces) >= self.max_queue:
            self.dropped_spans += spans
            return
        traces.append(encoded)
        self._traces_spans += spans
        self._timer.arm()  # without an event loop, `flush` ships it

    def _ship(self, batch: list[tuple[bytes, int]]) -> bool:
        raise NotImplementedError  # `_drain` is overridden

    def _drain(self) -> None:
        traces = self._traces
        if not traces:
            return
        spans = self._traces_spans
        self.submitted_spans += spans
        self._traces, self._traces_spans = [], 0
        if not self._alive():
            self.dropped_spans += spans
            return
        if len(self._out) > self.max_buffer:
            self.dropped_spans += spans  # the child is not keeping up
            return
        data = frame(b"\xdd" + len(traces).to_bytes(4, "big") + b"".join(traces))  # a msgpack array32
        self._out += data
        self._out_sizes.append(len(data))
        self._out_spans.append(spans)
        self._write_some()

    def stats(self) -> dict[str, int]:
        return {
            "submitted": self.submitted_spans + self._traces_spans,
            "exported": self.exported_spans,
            "dropped": self.dropped_spans,
            "queued": len(self._traces),
        }

    def _alive(self) -> bool:
        process = self.process
        if process is not None and process.poll() is None:
            return True
        if time.monotonic() - self._started_at < self.restart_pause:
            return False
        self._lost_buffer()
        log.warning("the span-export process exited (%s); starting a new one", _exit(process))
        self.restarts += 1
        try:
            self._spawn()
        except OSError as exc:
            log.warning("cannot start the span-export process: %s", exc)
            return False
        return True

    def _lost_buffer(self) -> None:
        self.dropped_spans += sum(self._out_spans)
        self._out.clear()
        self._out_spans.clear()
        self._out_sizes.clear()
        self._stop_watching()

    def _write_some(self) -> None:
        out = self._out
        try:
            while out:
                written = os.write(self._fd, out)
                del out[:written]
                self._count_written(written)
        except BlockingIOError:
            pass
        except OSError as exc:  # the child is gone (EPIPE): what it did not read is lost
            log.warning("span batches lost: the span-export process is gone (%s)", exc)
            self._lost_buffer()
            return
        loop = self._timer.loop
        if out and not self._writing and loop is not None and loop.is_running():
            loop.add_writer(self._fd, self._write_some)
            self._writing = True
        elif not out:
            self._stop_watching()

    def _count_written(self, written: int) -> None:
        sizes, spans = self._out_sizes, self._out_spans
        while written and sizes:
            if written >= sizes[0]:
                written -= sizes.pop(0)
                self.exported_spans += spans.pop(0)
            else:
                sizes[0] -= written
                written = 0

    def _stop_watching(self) -> None:
        loop = self._timer.loop
        if self._writing and loop is not None:
            with contextlib.suppress(Exception):
                loop.remove_writer(self._fd)
        self._writing = False

    def flush(self, timeout: float = 5.0) -> bool:
        """Ship everything now, waiting (up to `timeout`) for the pipe to take it (no event loop needed)."""
        self._drain()
        deadline = time.monotonic() + timeout
        while self._out and self._fd >= 0:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            select.select([], [self._fd], [], min(left, 0.1))
            self._write_some()
        return True

    def close(self) -> None:
        self._timer.cancel()
        self.flush()
        self._stop_watching()
        self._stop()

    def _stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.stdin is not None:
            with contextlib.suppress(OSError):
                process.stdin.close()  # the child flushes its exporter and exits
        self._fd = -1
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _exit(process: subprocess.Popen[bytes] | None) -> str:
    return "never started" if process is None else f"exit status {process.returncode}"
