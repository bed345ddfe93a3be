"""What a calibration sweep is asked to do (`Options`), and what the server says about itself (`Geometry`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Geometry:
    """What the server says about itself (step 1 of the sweep)."""

    max_model_len: int
    block_size: int
    num_blocks: int
    vllm_version: str = ""
    round_trip_s: float = 0.0
    """A bare request's round trip (`GET /health`, median): the client's and HTTP's own time; with the
    timed requests sent through a gateway (`Options.through`), plus what it adds to a forwarded one."""


@dataclass(slots=True)
class Options:
    url: str
    model: str
    accelerator: str = "unknown"
    budget_s: float = 600.0
    max_concurrency: int = 64
    seed: int = 1
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    repeats: int = 8
    """Requests per prefill level."""
    through: str | None = None
    """Where the timed requests go when not to `url` itself: a gateway in front of the server, so the
    profile holds the hop the gateway's traffic pays (on a machine the gateway shares with the server)."""
