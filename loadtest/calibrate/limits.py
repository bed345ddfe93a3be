"""What the calibration takes as given where the sweep cannot measure it: the server's scheduler limits
when no level showed them, and the front end's spread."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from backends.calibrated import Limits
from loadtest.calibrate.levels import Level

if TYPE_CHECKING:
    from loadtest.calibrate.sweep import Geometry, Options

CPU_LIMITS = (128, 2048)
"""vLLM's CPU build's scheduler defaults for the OpenAI server (max_num_seqs, max_num_batched_tokens)."""
GPU_LIMITS = (1024, 8192)
"""vLLM's defaults on a GPU with 70 GiB or more that is not an A100 (profiles.engine_defaults)."""
REQUEST_CV = 1.0
"""The front end's spread from one request to the next (StepFit.request_cv), as much as an exponential
draw: the sweep's cohorts cannot show it, the held-apart loads did (a TTFT p90 1.4 to 2.0 times the
median at 12 streams whatever the prompt; docs/calibrate.md, 2026-11-28, 05:50)."""


def limits_of(options: Options, geometry: Geometry, levels: Sequence[Level]) -> Limits:
    defaults = CPU_LIMITS if options.accelerator == "cpu" else GPU_LIMITS
    max_num_seqs = options.max_num_seqs
    if max_num_seqs is None:
        # a queue of all the rest while fewer than the sent requests ran: the server's max_num_seqs. A
        # request waits a step for the scheduler to take it at any load, so a few seen waiting beside
        # fewer running tell nothing (a level of 16 read 10 running and 2 waiting on an uncapped server)
        seen = [
            int(lv.max_running)
            for lv in levels
            if lv.kind == "load"
            and 0 < lv.max_running < lv.concurrency
            and lv.max_running + lv.max_waiting >= lv.concurrency
        ]
        max_num_seqs = min(seen) if seen else defaults[0]
    return Limits(
        block_size=geometry.block_size,
        num_blocks=geometry.num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens or max(defaults[1], geometry.max_model_len),
        max_model_len=geometry.max_model_len,
    )
