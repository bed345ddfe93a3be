"""bench_sse compares like with like: every shape carries the whole stream, both relays agree on it."""

from __future__ import annotations

import pytest

from gateway.request import sse
from loadtest.bench import sse as bench_sse


def test_every_shape_carries_the_whole_stream() -> None:
    stream = bench_sse.vllm_stream(8)
    for pieces in bench_sse.shapes(stream).values():
        assert b"".join(pieces) == stream
    out, usage, events = bench_sse.relay_once(sse, [stream], keep_usage=False)
    assert usage is not None and usage.completion_tokens == 8
    assert events == 8 + 3  # role chunk, 8 tokens, usage chunk, [DONE]
    assert b'"usage"' not in out and out.endswith(b"data: [DONE]\n\n")


def test_a_run_against_the_last_commit_prints_every_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_sse.main(["--repeats", "1"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert len(rows) == 6
    assert all(float(row[-1]) > 0 for row in rows)
