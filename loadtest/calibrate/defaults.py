"""What the calibration takes as given where the sweep cannot measure it: the server's scheduler limits
when no level showed them (sweep.limits_of), and the front end's spread."""

from __future__ import annotations

CPU_LIMITS = (128, 2048)
"""vLLM's CPU build's scheduler defaults for the OpenAI server (max_num_seqs, max_num_batched_tokens)."""
GPU_LIMITS = (1024, 8192)
"""vLLM's defaults on a GPU with 70 GiB or more that is not an A100 (profiles.engine_defaults)."""
REQUEST_CV = 1.0
"""The front end's spread from one request to the next (StepFit.request_cv) when the sweep ran no staggered
level to measure it by (refine.fit_request_cv): as much as an exponential draw. Held-apart loads showed a
TTFT p90 1.4 to 2.0 times the median at 12 streams whatever the prompt (docs/calibrate.md, 2026-11-28,
05:50); the refined terms carry most of that, so a sweep that measures it finds less."""
