"""A model's size in billions of parameters, read from the names it is served under.

The accelerator priors (backends/accelerators.py) are for an 8B model. A decode step at light load reads every
weight once, so its time, and the saturated throughput, scale with the model's size: a 70B model decodes
about 9x slower than an 8B one on the same GPU. Names say the size by convention (`Llama-3.1-70B-Instruct`,
`qwen2.5-0.5b`, `opt-125m`); a mixture of experts (`Mixtral-8x7B`) reads only some weights a step, so its
name gives no size, and neither does a name without one: the pool's `model_params_b` says it then.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REFERENCE_PARAMS_B = 8.0
"""The model size the accelerator facts are for."""

_SIZE = re.compile(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)([bm])(?![a-z0-9])")


def params_b_from_name(name: str) -> float | None:
    """Billions of parameters a model name states, or None (`meta-llama/Llama-3.1-8B-Instruct` -> 8)."""
    base = name.rsplit("/", 1)[-1].lower()
    sizes = [float(n) / (1000 if unit == "m" else 1) for n, unit in _SIZE.findall(base)]
    return sizes[-1] if sizes and sizes[-1] > 0 else None


def params_b_from_names(names: Iterable[str]) -> float | None:
    """The largest size the names state (a pool's backends serve one model; aliases may omit it)."""
    sizes = [size for size in map(params_b_from_name, names) if size is not None]
    return max(sizes) if sizes else None
