"""One record schema: the ledger's `UsageRecord`, the access log's line and the what-if reader agree on every
field, through a real write (AccessLog) and a real read (read_log)."""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path

import msgspec

from gateway.ledger.records import LEDGER_ONLY, AccessLine, UsageRecord
from gateway.telemetry.logs import AccessLog, session_hash
from loadtest.whatif.accesslog import read_log

LOG_ONLY = {"ts", "error_code", "error", "request_body", "level", "logger", "session_hash"}
"""Fields of a line that are the log's own, not a record's (`session_hash`: of the record's `session`)."""


def _record() -> UsageRecord:
    """A record with every field away from its default, so a field the log drops cannot pass unseen."""
    return UsageRecord(
        request_id="req-1",
        endpoint="/v1/chat/completions",
        model="llama-3.1-8b",
        backend="h100-0",
        pool="h100",
        vendor="nvidia",
        accelerator="h100",
        key="key_abc",
        request_class="interactive",
        route="balanced/interactive",
        stream=True,
        status=200,
        prompt_tokens=321,
        completion_tokens=45,
        usage_source="backend",
        ttft_s=0.125,
        duration_s=0.75,
        cost_usd=0.000123,
        finished_at=1_700_000_000.5,
        busy_s=0.25,
        prompt_estimate=300,
        max_tokens=64,
        n=2,
        priority="high",
        class_header="interactive",
        tenant="team-a",
        session="s-1",
        affinity="0badf00d",
        prefix=["00000001", "00000002"],
        bound_nusd=99,
        client_request_id="client-7",
        queued_s=0.5,
        prompt_chars=1200,
    )


def test_every_record_field_is_logged_or_named_ledger_only():
    record_fields = {f.name for f in dataclasses.fields(UsageRecord)}
    line_fields = set(AccessLine.__struct_fields__)
    assert record_fields >= LEDGER_ONLY
    assert record_fields - LEDGER_ONLY == line_fields - LOG_ONLY, (
        "a UsageRecord field must be written to the access log (AccessLine) or named in LEDGER_ONLY"
    )


def test_every_record_default_is_the_lines_default():
    """A line leaves out a default (omit_defaults): the reader must fill in the record's own."""
    defaults = {f.name: f.default for f in dataclasses.fields(UsageRecord)}
    line_defaults = dict(zip(AccessLine.__struct_fields__[-len(AccessLine.__struct_defaults__) :],
                             AccessLine.__struct_defaults__, strict=True))  # fmt: skip
    for name, default in defaults.items():
        if name in LEDGER_ONLY or default is dataclasses.MISSING:
            continue
        assert line_defaults[name] == default, name


def test_a_record_written_by_the_access_log_reads_back_equal(tmp_path: Path):
    record = _record()
    out = io.BytesIO()
    log = AccessLog(out)
    log.record(record)
    log.flush()
    path = tmp_path / "access.jsonl"
    path.write_bytes(out.getvalue())

    trace = read_log(path)
    assert len(trace.requests) == 1
    line = trace.requests[0].line
    assert line.ts == record.finished_at
    for name in AccessLine.__struct_fields__:
        if name not in LOG_ONLY:
            assert getattr(line, name) == getattr(record, name), name
    assert line.session_hash == session_hash("s-1") and len(line.session_hash) == 16
    assert b"s-1" not in out.getvalue()  # the session id itself is never written
    # The reader keeps the writer's schema: encoding what it read gives the same line back.
    assert msgspec.json.encode(line) == out.getvalue().strip()
