"""How one simulated backend behaves: model, pacing or hardware profile, limits, faults."""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec

from backends.sim.faults import Faults
from backends.sim.profiles import Hardware, ProfileError
from backends.sim.timing import FixedTiming, Timing


@dataclass(frozen=True, slots=True)
class SimOptions:
    """How one simulated backend behaves.

    With `hardware` set the continuous-batching performance model times every request; without it
    each request gets the fixed `ttft_ms`/`tpot_ms` (or `timing`), whatever the load. Durations are
    simulated; `time_scale` runs the simulated clock that many times faster than real time.
    """

    models: tuple[str, ...] = ("sim-model",)
    name: str = "sim"
    max_model_len: int = 8192
    ttft_ms: float = 20.0
    tpot_ms: float = 5.0
    seed: int = 0
    fail_status: int | None = None
    kv_capacity_tokens: int = 400_000  # notional KV cache size behind vllm:kv_cache_usage_perc (fixed timing)
    timing: Timing | None = field(default=None, compare=False)  # replaces ttft_ms/tpot_ms when set
    hardware: Hardware | None = None
    time_scale: float = 1.0
    faults: Faults | None = None

    def resolved_timing(self) -> Timing:
        return self.timing or FixedTiming(self.ttft_ms, self.tpot_ms)

    def resolved_faults(self) -> Faults:
        faults = self.faults or Faults()
        if self.fail_status is not None:
            faults = msgspec.structs.replace(faults, error_rate=1.0, error_status=self.fail_status)
        return faults

    def check(self) -> None:
        """Refuse options a vLLM server would refuse at start (raises ProfileError)."""
        hardware = self.hardware
        if hardware is not None and self.max_model_len > hardware.kv_capacity_tokens:
            raise ProfileError(
                f"max_model_len {self.max_model_len} is larger than the KV cache of "
                f"{hardware.describe()} ({hardware.kv_capacity_tokens} tokens); lower max_model_len "
                "or use more GPUs"
            )
