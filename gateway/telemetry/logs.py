"""The access log: one JSON line per request, with its request id, and no prompt or completion text.

A line is one msgspec encode of a Struct (about a microsecond); lines are buffered and written together by
a timer every `FLUSH_S` (or when `MAX_BUFFERED` are waiting), so the request path makes no system call.
What is still buffered is written at shutdown. Prompts are logged only when an operator sets
`telemetry.access_log.include_prompts` (the request body as sent, under `request_body`).

A line also keeps what `switchyard whatif` needs to replay the request (loadtest/whatif/): the inputs of
classification (`prompt_chars`, `prompt_estimate`, `max_tokens`, `n`, `priority`, `class_header`,
`tenant`) and, instead of the prompt, hashes of its start: `affinity` (what `prefix-affinity` keys on)
and `prefix` (chain hashes of its leading 1024-character blocks, so prompts sharing a document share
leading hashes), and `session_hash` (a 64-bit hash of its session id, so a replay keeps each session's
requests in order).

The log is the `switchyard.access` logger's to silence: below INFO (`switchyard serve --log-level
warning`) it writes nothing.
"""

from __future__ import annotations

import hashlib
import logging
import sys
import time
import zlib
from typing import IO, Protocol

import msgspec

from gateway.ledger.records import LOGGER, AccessLine, UsageRecord
from gateway.telemetry.batch_timer import BatchTimer

FLUSH_S = 0.2
MAX_BUFFERED = 512


PREFIX_BLOCK_CHARS = 1024
"""One prefix hash per this many prompt characters (about 256 tokens)."""
PREFIX_BLOCKS = 32
AFFINITY_CHARS = 512
"""What `prefix-affinity` reads of the prompt by default (policies/scorers/affinity.py)."""


class _Prompt(Protocol):
    def prompt_prefix(self, chars: int) -> str: ...


class _ReplayKeys(Protocol):
    """What `replay_keys` reads and sets: a `UsageRecord`, or a log line being synthesised."""

    session: str | None
    affinity: str
    prefix: list[str] | None


def replay_keys(record: _ReplayKeys, parsed: _Prompt) -> None:
    """Set the record's `affinity` and `prefix` hashes from the prompt's start (only with the access log)."""
    text = parsed.prompt_prefix(PREFIX_BLOCK_CHARS * PREFIX_BLOCKS)
    key = record.session or text[:AFFINITY_CHARS]
    record.affinity = f"{zlib.crc32(key.encode('utf-8', 'surrogatepass')):08x}" if key else ""
    hashes: list[str] = []
    chain = 0
    for start in range(0, len(text) - PREFIX_BLOCK_CHARS + 1, PREFIX_BLOCK_CHARS):
        chunk = text[start : start + PREFIX_BLOCK_CHARS].encode("utf-8", "surrogatepass")
        chain = zlib.crc32(chunk, chain)
        hashes.append(f"{chain:08x}")
    record.prefix = hashes or None


def session_hash(session: str) -> str:
    """64 bits, so sessions of a long log do not collide (a 32-bit hash does from some 10^5 on)."""
    return hashlib.blake2b(session.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


class AccessLog:
    __slots__ = ("_buffer", "_encode", "_out", "_timer", "include_prompts")

    def __init__(self, out: IO[bytes], include_prompts: bool = False) -> None:
        self._out = out
        self.include_prompts = include_prompts
        self._buffer: list[bytes] = []
        self._encode = msgspec.json.Encoder().encode
        self._timer = BatchTimer(FLUSH_S, self.flush)

    @classmethod
    def open(cls, destination: str, include_prompts: bool = False) -> AccessLog | None:
        """The configured log, or None when the `switchyard.access` logger is below INFO."""
        if not logging.getLogger(LOGGER).isEnabledFor(logging.INFO):
            return None
        if destination == "stdout":
            out: IO[bytes] = sys.stdout.buffer
        elif destination == "stderr":
            out = sys.stderr.buffer
        else:
            out = open(destination, "ab")  # noqa: SIM115 - lives as long as the app; closed in close()
        return cls(out, include_prompts)

    def record(self, record: UsageRecord, body: bytes | None = None) -> None:
        r = record  # positional: a third of the cost of keyword construction
        line = AccessLine(
            r.finished_at, r.request_id, r.endpoint, r.status, r.model, r.stream, r.backend, r.pool,
            r.vendor, r.request_class, r.route, r.key, r.prompt_tokens, r.completion_tokens,
            r.usage_source, r.cost_usd, r.ttft_s, r.duration_s, None, None, None,
            r.prompt_estimate, r.max_tokens, r.n, r.priority, r.class_header, r.tenant, r.affinity, r.prefix,
        )  # fmt: skip
        if body is not None:
            line.request_body = body.decode("utf-8", "replace")
        if r.client_request_id is not None:
            line.client_request_id = r.client_request_id
        if r.queued_s:
            line.queued_s = round(r.queued_s, 6)
        if r.prompt_chars:
            line.prompt_chars = r.prompt_chars
        if r.session:
            line.session_hash = session_hash(r.session)
        self._write(line)

    def error(
        self, request_id: str, endpoint: str, status: int, code: str | None, message: str, body: bytes | None
    ) -> None:
        self._write(
            AccessLine(
                ts=round(time.time(), 6),
                request_id=request_id,
                endpoint=endpoint,
                status=status,
                error_code=code,
                error=message,
                level="warning" if status >= 500 else "info",
                request_body=body.decode("utf-8", "replace") if body is not None else None,
            )
        )

    def _write(self, line: AccessLine) -> None:
        buffer = self._buffer
        buffer.append(self._encode(line))
        if len(buffer) >= MAX_BUFFERED or not self._timer.arm():
            self.flush()

    def flush(self) -> None:
        self._timer.cancel()
        if not self._buffer:
            return
        lines, self._buffer = self._buffer, []
        try:
            self._out.write(b"\n".join(lines) + b"\n")
            self._out.flush()
        except (OSError, ValueError):
            pass  # a closed or full stdout must not break requests

    def close(self) -> None:
        self.flush()
        if self._out not in (sys.stdout.buffer, sys.stderr.buffer):
            self._out.close()
