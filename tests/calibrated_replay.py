"""What the replay tests of calibrated profiles share: a profile file and an access log of one class."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from backends.calibrated import CalibratedProfile, FitError, Limits, StepFit, dump_profile

MODEL = "tiny-llama"


def write_profile(path: Path, step: StepFit) -> Path:
    """A profile of `step` on a small server (16 sequences, 2,048 tokens a step, 512 of context)."""
    profile = CalibratedProfile(
        accelerator="mi300x",
        model=MODEL,
        step=step,
        limits=Limits(
            block_size=16, num_blocks=1024, max_num_seqs=16, max_num_batched_tokens=2048, max_model_len=512
        ),
        fit_error=FitError(ttft_mean=0, ttft_max=0, tpot_mean=0, tpot_max=0),
        saturated_tokens_per_second=1000.0,
    )
    path.write_text(dump_profile(profile))
    return path


def write_log(
    path: Path, requests: Sequence[tuple[float, float | None, float]], failed: Sequence[int] = ()
) -> Path:
    """An access log of streamed `chat` requests, (arrival, TTFT or None, duration) each: 100 prompt tokens
    and 10 output tokens; those at the indices in `failed` answered 502."""
    lines = []
    for i, (at, ttft, duration) in enumerate(requests):
        line: dict[str, object] = {
            "ts": 1000.0 + at + duration,
            "duration_s": duration,
            "request_id": f"r{i}",
            "endpoint": "completions",
            "status": 502 if i in failed else 200,
            "model": MODEL,
            "stream": True,
            "backend": "calibrated-0",
            "class": "chat",
            "prompt_tokens": 100,
            "completion_tokens": 10,
            "prompt_estimate": 100,
            "max_tokens": 10,
        }
        if ttft is not None:
            line["ttft_s"] = ttft
        lines.append(json.dumps(line) + "\n")
    path.write_text("".join(lines))
    return path
