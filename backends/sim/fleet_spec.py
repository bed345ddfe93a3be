"""The fleet file: which simulated backends to run, grouped by the gateway pool they belong to.

Format (YAML; unknown keys are errors, reported with file and line):

    model: llama-3.1-8b          # required: default model served by every group
    max_model_len: 8192          # optional, default 8192: default context window
    groups:                      # required, at least one
      - pool: h100               # required: pool name in the generated gateway config (unique)
        vendor: nvidia           # required: amd | nvidia
        accelerator: h100        # required: accelerator kind, free text
        count: 2                 # optional, default 1: backends in this group, named <pool>-0, <pool>-1, ...
        price_per_gpu_hour: 2.90 # required: USD per GPU-hour
        gpus_per_backend: 1      # optional, default 1
        ttft_ms: 15              # optional, default 20: delay before the first token
        tpot_ms: 6               # optional, default 5: delay between output tokens
        model: other-model       # optional: overrides the top-level model for this group
        max_model_len: 32768     # optional: overrides the top-level max_model_len
        fail_status: 503         # optional: every backend of the group answers requests with this status
        labels: {tier: latency}  # optional: copied to the pool in the gateway config
        profile:                 # optional: time requests with the GPU performance model instead of
          gpu: h100-sxm5         #   ttft_ms/tpot_ms; GPU profile or accelerator (backends/accelerators.py):
                                 #   h100(-sxm5) | h200 | b200 | a100 | l40s | mi300x | mi325x | mi355x
          model: llama-3.1-8b    #   model profile (default: the group's model): llama-3.1-8b | llama-3.1-70b
          overrides:             #   any profile figure by name, e.g.
            hbm_bandwidth_tbps: 3.0
            max_num_seqs: 128
        # or  profile: {calibrated: tiny.yaml}  a profile `switchyard calibrate` measured (instead of gpu)
        faults:                  # optional: faults injected from the start (backends/sim/faults.py)
          error_rate: 0.1
          error_status: 429
        time_scale: 10           # optional: overrides the top-level time_scale
    time_scale: 1                # optional, default 1: simulated seconds per real second, every backend

A group with `profile` runs the performance model on `gpus_per_backend` GPUs (tensor parallel), so a
70B model needs `gpus_per_backend: 2` on H100; a profile that cannot run is an error at its line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import msgspec

from backends.accelerators import Vendor, calibrated
from backends.calibrated import load_profile
from backends.sim.faults import Faults
from backends.sim.profiles import (
    MODEL_ALIASES,
    MODELS,
    Hardware,
    ProfileError,
    build_hardware,
    calibrated_hardware,
)
from backends.yamlfile import ConfigError, decode, parse_yaml

DEMO_FLEET: Path = Path(__file__).parent / "fleets" / "demo.yaml"

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=48, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Millis = Annotated[float, msgspec.Meta(ge=0)]
_Scale = Annotated[float, msgspec.Meta(gt=0)]


class ProfileSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    gpu: _Text | None = None
    model: _Text | None = None
    overrides: dict[str, float] = {}
    calibrated: _Text | None = None
    """A profile file `switchyard calibrate` wrote: the measured step model instead of `gpu`."""


class GroupSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pool: _Name
    vendor: Vendor
    accelerator: _Text
    price_per_gpu_hour: Annotated[float, msgspec.Meta(ge=0)]
    count: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1
    gpus_per_backend: Annotated[int, msgspec.Meta(ge=1)] = 1
    ttft_ms: _Millis = 20.0
    tpot_ms: _Millis = 5.0
    model: _Text | None = None
    max_model_len: Annotated[int, msgspec.Meta(gt=0)] | None = None
    fail_status: Annotated[int, msgspec.Meta(ge=400, le=599)] | None = None
    labels: dict[str, str] = {}
    profile: ProfileSpec | None = None
    faults: Faults | None = None
    time_scale: _Scale | None = None

    def hardware(self, default_model: str) -> Hardware | None:
        """The group's performance-model hardware, or None for fixed timing; raises ProfileError."""
        if self.profile is None:
            return None
        if (self.profile.calibrated is None) == (self.profile.gpu is None):
            raise ProfileError("a profile names either `gpu` or `calibrated` (a measured profile file)")
        if self.profile.calibrated is not None:
            try:
                return calibrated_hardware(load_profile(self.profile.calibrated))
            except ConfigError as exc:
                raise ProfileError(str(exc)) from None
        assert self.profile.gpu is not None
        model = self.profile.model or self.model or default_model
        if MODEL_ALIASES.get(model, model) not in MODELS and calibrated(self.profile.gpu, model) is None:
            raise ProfileError(f"model `{model}` has no profile; name one with `profile.model`")
        return build_hardware(self.profile.gpu, model, self.gpus_per_backend, self.profile.overrides)


class FleetSpec(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: _Text
    groups: Annotated[list[GroupSpec], msgspec.Meta(min_length=1)]
    max_model_len: Annotated[int, msgspec.Meta(gt=0)] = 8192
    time_scale: _Scale = 1.0


def parse_fleet_spec(text: str, source: str = "<fleet>") -> FleetSpec:
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        raise ConfigError(source, 1, "the fleet file must be a mapping with `model` and `groups`")
    spec = decode(data, lines, FleetSpec, source)
    seen: set[str] = set()
    for index, group in enumerate(spec.groups):
        if group.pool in seen:
            line = lines.get(("groups", index, "pool"))
            raise ConfigError(source, line, f"pool `{group.pool}` is declared by two groups")
        seen.add(group.pool)
        try:
            hardware = group.hardware(spec.model)
        except ProfileError as exc:
            raise ConfigError(source, lines.get(("groups", index, "profile")), str(exc)) from None
        max_model_len = group.max_model_len or spec.max_model_len
        if hardware is not None and max_model_len > hardware.kv_capacity_tokens:
            raise ConfigError(
                source,
                lines.get(("groups", index, "profile")),
                f"max_model_len {max_model_len} is larger than the KV cache of {hardware.describe()} "
                f"({hardware.kv_capacity_tokens} tokens)",
            )
    return spec


def load_fleet_spec(path: str | Path) -> FleetSpec:
    """Read and validate a fleet file; raises ConfigError naming the file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read fleet file: {exc.strerror}") from None
    return parse_fleet_spec(text, str(path))
