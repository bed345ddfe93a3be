"""How long one engine step takes on a `Hardware`: the GPU performance model.

One step runs a chunk of prefill for the prompts being admitted and one decode token for every
running sequence, as vLLM's continuous batching does. Its duration is

    t = overhead + seq_overhead * seqs
        + prefill_flops
        + max(bytes_read / B, decode_flops)

    F = peak FLOP/s * gpus * tp * flops_eff(tokens in the step)
    B = peak bandwidth * gpus * tp * bw_eff(sequences in the step)
    prefill_flops = 2 * params * prefill tokens / F + attention(context each prefilled token sees) / A
    decode_flops  = 2 * params * decode sequences / F + attention(decode context tokens) / A
    attention(n)  = 4 * layers * hidden * n;  A = peak FLOP/s * gpus * tp * attention_eff
    bytes_read    = weights + KV bytes per token * decode context tokens

Prefill is compute-bound (its FLOPs add on top); decode is bandwidth-bound (every step streams the
weights and the batch's KV cache once) until a large batch makes its FLOPs the bound (the roofline
`max`). `tp` is `tp_efficiency` with more than one GPU, else 1.

A calibrated backend (`Hardware.fitted`, backends/calibrated.py) is priced by its measured linear model
instead: overhead + per sequence + per prefill token + per decode context token, times the factor of
the slow spell the step starts in when the profile measured them (backends/sim/spells.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.sim.profiles import Hardware
from backends.sim.spells import Spells


@dataclass(frozen=True, slots=True)
class StepWork:
    prefill_tokens: int = 0
    prefill_context: float = 0.0  # sum, over prefilled tokens, of the context each attends to
    prefill_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0  # sum of the context lengths of the decoding sequences


class PerfModel:
    def __init__(self, hardware: Hardware, seed: int = 0) -> None:
        """`seed`: the draw of a calibrated backend's slow spells (two backends, two seeds)."""
        gpu, model = hardware.gpu, hardware.model
        scale = hardware.gpus * (gpu.tp_efficiency if hardware.gpus > 1 else 1.0)
        self.hardware = hardware
        self._flops = gpu.bf16_tflops * 1e12 * scale
        self._bandwidth = gpu.hbm_bandwidth_tbps * 1e12 * scale
        self._attention_flops = self._flops * gpu.attention_eff
        self._flops_eff = gpu.flops_eff
        self._bw_eff = gpu.bw_eff
        self._overhead = gpu.step_overhead_ms / 1e3
        self._seq_overhead = gpu.seq_overhead_us / 1e6
        self._weights = model.weights_bytes
        self._kv_bytes = model.kv_bytes_per_token
        self._flops_per_token = model.flops_per_token
        self._attention = model.attention_flops_per_context_token
        self._fitted = hardware.fitted
        pace = hardware.fitted.pace if hardware.fitted is not None else None
        self._spells = Spells(pace, seed) if pace is not None else None

    @property
    def paced(self) -> bool:
        """Whether its steps meet slow spells (a calibrated profile that measured them)."""
        return self._spells is not None

    def step_seconds(self, work: StepWork, at: float | None = None) -> float:
        """The step's duration; `at`: when it starts (the simulator's clock), for a slow spell's factor."""
        seqs = work.prefill_seqs + work.decode_seqs
        if seqs == 0:
            return 0.0
        if self._fitted is not None:
            seconds = self._fitted.step_seconds(seqs, work.prefill_tokens, work.decode_context)
            spells = self._spells
            return seconds * spells.factor(at) if spells is not None and at is not None else seconds
        flops = self._flops * self._flops_eff(work.prefill_tokens + work.decode_seqs)
        bandwidth = self._bandwidth * self._bw_eff(seqs)
        attention = self._attention_flops
        prefill_seconds = (
            work.prefill_tokens * self._flops_per_token / flops
            + work.prefill_context * self._attention / attention
        )
        decode_seconds = (
            work.decode_seqs * self._flops_per_token / flops
            + work.decode_context * self._attention / attention
        )
        bytes_read = self._weights + self._kv_bytes * work.decode_context
        return (
            self._overhead
            + self._seq_overhead * seqs
            + prefill_seconds
            + max(bytes_read / bandwidth, decode_seconds)
        )

    def decode_seconds(self, batch: int, context: int) -> float:
        """One pure decode step of `batch` sequences of `context` tokens each (for docs and calibration)."""
        return self.step_seconds(StepWork(decode_seqs=batch, decode_context=batch * context))
