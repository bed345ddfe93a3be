"""The stream relay's own cost per stream (gateway/request/sse.py), against an earlier commit's in one run.

A 64-token chat stream shaped like vLLM's (role chunk, one chunk per token, the usage chunk, `[DONE]`)
is fed to `SseRelay` as it reaches the gateway in three shapes: the whole answer in one read (what a
fast backend or a static upstream such as the peers harness's nginx produces), one read per event
(vLLM pacing tokens out), and 4 KB reads. Both implementations must produce the same bytes and usage
before they are timed. Figures are the median over `--repeats` of the best-of-5 mean per stream, in µs.

Usage: `python -m loadtest.bench.sse [--baseline REF] [--repeats 7]` (REF: a git commit whose
gateway/request/sse.py is the baseline; default HEAD, so the working tree is compared with the last
commit).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from gateway.request import sse as current

ROOT = Path(__file__).resolve().parents[2]


def vllm_stream(tokens: int = 64) -> bytes:
    def event(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"

    head = {"id": "chatcmpl-5f1c", "object": "chat.completion.chunk", "created": 1735000000, "model": "m"}
    events = [event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    for i in range(tokens):
        finish = "length" if i == tokens - 1 else None
        delta = {"content": f" word{i}"}
        events.append(event({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
    usage = {"prompt_tokens": 212, "completion_tokens": tokens, "total_tokens": 212 + tokens}
    events.append(event({**head, "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return b"".join(events)


def shapes(stream: bytes) -> dict[str, list[bytes]]:
    events = [e + b"\n\n" for e in stream.split(b"\n\n") if e]
    return {
        "one read": [stream],
        "one read per event": events,
        "4 KB reads": [stream[i : i + 4096] for i in range(0, len(stream), 4096)],
    }


def baseline_module(ref: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{ref}:gateway/request/sse.py"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tempfile.NamedTemporaryFile("wb", suffix=".py", delete=False) as file:
        file.write(source)
    spec = importlib.util.spec_from_file_location("sse_baseline", file.name)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    Path(file.name).unlink()
    return module


def relay_once(module: ModuleType, pieces: list[bytes], keep_usage: bool) -> tuple[bytes, Any, int]:
    relay = module.SseRelay(keep_usage)
    out = b"".join([relay.feed(piece) for piece in pieces]) + relay.flush()
    return out, relay.usage, relay.events


def per_stream_us(module: ModuleType, pieces: list[bytes], keep_usage: bool, repeats: int) -> float:
    run: Callable[[], object] = lambda: relay_once(module, pieces, keep_usage)  # noqa: E731
    number = 500
    samples = [min(timeit.repeat(run, number=number, repeat=5)) / number * 1e6 for _ in range(repeats)]
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="HEAD", help="git ref of the baseline sse.py (default HEAD)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    baseline = baseline_module(args.baseline)
    stream = vllm_stream()
    print(f"one 64-token stream, {len(stream)} bytes; µs per stream, median of {args.repeats}")
    print(f"{'shape':<20} {'usage chunk':<12} {args.baseline:>10} {'now':>8} {'now/base':>9}")
    for name, pieces in shapes(stream).items():
        for keep_usage in (False, True):
            assert relay_once(current, pieces, keep_usage) == relay_once(baseline, pieces, keep_usage), name
            base = per_stream_us(baseline, pieces, keep_usage, args.repeats)
            now = per_stream_us(current, pieces, keep_usage, args.repeats)
            kept = "kept" if keep_usage else "dropped"
            print(f"{name:<20} {kept:<12} {base:>10.1f} {now:>8.1f} {now / base:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
