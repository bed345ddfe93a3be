"""Where finished traces go: a `SpanShipper` takes one encoded trace per request from the event loop and
hands them on in batches, to the span-export child process (`ChildProcessShipper`) or, in tests, to an
exporter in process (`InProcessShipper`). See gateway/telemetry/tracing.py.
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
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.telemetry.batch_timer import BatchTimer
from gateway.telemetry.span_export import frame, to_readable_spans

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("switchyard.telemetry")


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
        stdin = self.process.stdin
        assert stdin is not None  # stdin=PIPE
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
