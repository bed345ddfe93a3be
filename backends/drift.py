"""Is a backend still what its profile says? Measured TTFT and TPOT over the profile's prediction.

The gateway feeds every streamed answer's TTFT and time per output token here, beside the prediction of
the backend's pool profile for that request at the load the gateway last scraped: a calibrated pool's
step model (backends/calibrated.py) at its running sequences, or the datasheet's light-load priors (then
only while at most one other request runs, where those priors hold). The ratio measured / predicted is
averaged (exponentially, as the routing averages are) and exported as
`switchyard_profile_error_ratio{backend,metric}`; a ratio that stays more than `BOUND` away from 1 for
`WINDOW_S` is reported once (the gateway logs it) until it comes back.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.calibrated import StepFit

BOUND = 0.30
WINDOW_S = 300.0
WEIGHT = 0.1
METRICS = ("ttft", "tpot")


@dataclass(slots=True)
class DriftMetric:
    ratio: float | None = None
    off_since: float | None = None
    reported: bool = False

    def observe(self, ratio: float, now: float) -> bool:
        """Add one measured/predicted ratio; True once the average has been off by more than BOUND for
        WINDOW_S (then not again until it has come back within BOUND)."""
        self.ratio = ratio if self.ratio is None else self.ratio + WEIGHT * (ratio - self.ratio)
        if abs(self.ratio - 1.0) <= BOUND:
            self.off_since, self.reported = None, False
            return False
        if self.off_since is None:
            self.off_since = now
        if not self.reported and now - self.off_since >= WINDOW_S:
            self.reported = True
            return True
        return False


@dataclass(slots=True)
class ProfileDrift:
    """One backend's drift from its pool's profile, per metric."""

    metrics: dict[str, DriftMetric] = field(default_factory=lambda: {m: DriftMetric() for m in METRICS})

    def observe(self, metric: str, measured: float, predicted: float, now: float) -> bool:
        if predicted <= 0 or measured <= 0:
            return False
        return self.metrics[metric].observe(measured / predicted, now)


def predict(
    step: StepFit | None,
    prior_ttft_s: float,
    prior_tpot_s: float,
    running: float,
    prompt_tokens: int,
    output_tokens: int,
) -> tuple[float | None, float | None]:
    """The profile's TTFT and time per output token for a request of this size beside `running` others;
    (None, None) where the profile cannot say (datasheet priors under load)."""
    others = max(0, round(running) - 1)
    if step is None:
        return (prior_ttft_s, prior_tpot_s) if others <= 1 else (None, None)
    context = prompt_tokens + output_tokens / 2
    decode = step.step_seconds(others, 0, others * context) if others else 0.0
    ttft = (
        step.front_end(others)
        + decode / 2
        + step.admission_wait(others)
        + step.step_seconds(1 + others, prompt_tokens, others * context)
    )
    tpot = step.step_seconds(1 + others, 0, (1 + others) * context)
    return ttft, tpot
