"""The latency averages routing reads come from answers as the backend decoded them."""

from __future__ import annotations

from backends.drift import ProfileDrift
from backends.models import EngineLoad, Observed
from gateway.ledger.records import UsageRecord
from gateway.request.drift import observe
from tests.unit.backends.test_drift import pool


class _Backend:
    def __init__(self) -> None:
        self.name = "b"
        self.observed = Observed()
        self.pool = pool()
        self.load = EngineLoad()
        self.drift = ProfileDrift()


def _record(completion: int, duration: float, n: int = 1, stream: bool = False, ttft: float | None = None):
    return UsageRecord(
        request_id="r",
        endpoint="chat",
        model="m",
        backend="b",
        pool="p",
        vendor="nvidia",
        accelerator="h100",
        key="k",
        request_class="batch",
        route="r/batch",
        stream=stream,
        status=200,
        prompt_tokens=10,
        completion_tokens=completion,
        usage_source="backend",
        ttft_s=ttft,
        duration_s=duration,
        cost_usd=0.0,
        finished_at=0.0,
        n=n,
    )


def test_n_choices_are_decoded_side_by_side() -> None:
    one, two = _Backend(), _Backend()
    observe(one, _record(completion=200, duration=2.0))  # type: ignore[arg-type]
    observe(two, _record(completion=400, duration=2.0, n=2))  # type: ignore[arg-type]
    assert one.observed.tpot == two.observed.tpot == 0.01


def test_a_short_answer_of_several_choices_says_nothing_of_decode_speed() -> None:
    backend = _Backend()
    observe(backend, _record(completion=24, duration=1.0, n=4))  # type: ignore[arg-type]  # 6 tokens each
    assert backend.observed.tpot is None


def test_a_stream_gives_ttft_and_time_per_token() -> None:
    backend = _Backend()
    observe(backend, _record(completion=11, duration=1.1, stream=True, ttft=0.1))  # type: ignore[arg-type]
    assert backend.observed.ttft == 0.1 and abs(backend.observed.tpot - 0.1) < 1e-12  # type: ignore[operator]
