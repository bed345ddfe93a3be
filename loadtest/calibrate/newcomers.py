"""What a newcomer's prefill costs the streams already decoding, read off a load's own timings.

Per request, its time between the first and the last token per step is set against what happened in
that window: the requests that got their first token in it (newcomers, each prefilled in a step this
one shared) and their prompt tokens, per step, and the sequences decoding beside it and their context,
on average. A least-squares line over a load's requests gives what a newcomer cost the streams, a fixed
part and a part per prompt token, to set beside what a profile's step model charges for it
(`StepFit.prefill_seconds`). The sweep sends its loaded levels' newcomers as cohorts of one prompt size,
the held-apart load one at a time with prompts of every size (docs/calibrate.md, 2026-11-28).

Usage: python -m loadtest.calibrate.newcomers DIR [DIR ...] [--profile profile.yaml] [--refine-s 20]
       DIR: a recording (SWITCHYARD_CALIBRATE_RECORD=DIR make test-calibrate). The held-apart load is
       also run on the simulator's scheduler from the profile (by default the one the recorded sweep
       fits, as `switchyard calibrate` would), and its requests read the same way.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from backends.calibrated import CalibratedProfile, load_profile
from loadtest.calibrate.fit import gauss
from loadtest.calibrate.measure import Timed
from loadtest.calibrate.offline import refit, virtual_run
from loadtest.calibrate.recording import Recording, load

SIZES = (16, 61, 128, 244, 488)
"""Prompt sizes the newcomer's cost is shown at."""


@dataclass(frozen=True, slots=True)
class Window:
    """One request's decoding, per step, and what ran beside it."""

    step_s: float
    newcomers: float
    """Requests whose first token came in this one's window, per step."""
    newcomer_tokens: float
    """Their prompt tokens, per step."""
    running: float
    """Sequences decoding, on average over the window (this one included)."""
    context: float
    """Their tokens of context (prompt plus half the output), on average over the window."""

    @property
    def features(self) -> tuple[float, ...]:
        return (1.0, self.newcomers, self.newcomer_tokens, self.running, self.context)


@dataclass(frozen=True, slots=True)
class NewcomerCost:
    """The fitted line, in seconds per step: `base` + `per_newcomer` and `per_token` times a newcomer's
    prompt, `per_running` per sequence, `per_context_token` per token of their context."""

    base: float
    per_newcomer: float
    per_token: float
    per_running: float
    per_context_token: float
    requests: int

    def at(self, prompt_tokens: int) -> float:
        """What one newcomer of `prompt_tokens` cost the streams, in seconds."""
        return self.per_newcomer + self.per_token * prompt_tokens


def windows(timed: Sequence[Timed]) -> list[Window]:
    """Each request of one load with at least two steps of decoding; the load's requests are timed on one
    clock and ran on one server (so not two levels together: their requests did not run beside each
    other)."""
    spans = [(t.sent_at + t.ttft_s, t.sent_at + t.e2e_s) for t in timed]
    out = []
    for i, request in enumerate(timed):
        start, end = spans[i]
        steps = request.output_tokens - 1
        if steps < 2 or end <= start:
            continue
        length = end - start
        newcomers = [t for j, t in enumerate(timed) if j != i and start < spans[j][0] <= end]
        running = context = 0.0
        for other, (first, last) in zip(timed, spans, strict=True):
            overlap = min(end, last) - max(start, first)
            if overlap > 0:
                share = overlap / length
                running += share
                context += share * (other.prompt_tokens + other.output_tokens / 2)
        out.append(
            Window(
                step_s=length / steps,
                newcomers=len(newcomers) / steps,
                newcomer_tokens=sum(t.prompt_tokens for t in newcomers) / steps,
                running=running,
                context=context,
            )
        )
    return out


def regress(rows: Sequence[Window]) -> NewcomerCost:
    """Least squares of the step time on the window's features; ValueError when they cannot be told apart
    (one prompt size only, or no newcomers)."""
    features = [row.features for row in rows]
    width = len(features[0]) if features else 0
    if len(rows) <= width:
        raise ValueError(f"{len(rows)} requests cannot fit {width} terms")
    gram = [[sum(f[a] * f[b] for f in features) for b in range(width)] for a in range(width)]
    moment = [sum(f[a] * row.step_s for f, row in zip(features, rows, strict=True)) for a in range(width)]
    try:
        solution = gauss(gram, moment, singular=1e-12)
    except ValueError:
        raise ValueError("the newcomers' count and prompt tokens cannot be told apart in this load") from None
    base, per_newcomer, per_token, per_running, per_context = solution
    return NewcomerCost(base, per_newcomer, per_token, per_running, per_context, len(rows))


def split(rows: Sequence[Window]) -> tuple[float, float]:
    """A load's mean step and, of it, what its newcomers added (by its own line, `regress`)."""
    cost = regress(rows)
    newcomers = statistics.fmean(
        cost.per_newcomer * w.newcomers + cost.per_token * w.newcomer_tokens for w in rows
    )
    return statistics.fmean(w.step_s for w in rows), newcomers


def _costs(label: str, loads: Sequence[Sequence[Timed]]) -> str:
    try:
        cost = regress([window for timed in loads for window in windows(timed)])
    except ValueError as exc:
        return f"  {label:30} {exc}"
    at = "".join(f"{cost.at(size) * 1000:8.2f}" for size in SIZES)
    return f"  {label:30}{at}   ({cost.requests} requests)"


def _split(timed: Sequence[Timed]) -> str:
    try:
        step, newcomers = split(windows(timed))
    except ValueError:
        return f"{'-':>22}"
    return f"{step * 1000:6.2f} = {newcomers * 1000:5.2f} + {(step - newcomers) * 1000:5.2f}"


def report(name: str, recording: Recording, profile: CalibratedProfile) -> str:
    sweep = [lv.timed for lv in recording.levels if lv.kind == "load" and lv.concurrency > 1]
    held = [run.timed for run in recording.real]
    # each level on a virtual clock of its own, from 0
    replayed = [run.timed for run in virtual_run(profile, recording.jobs, recording.widths, recording.pieces)]
    sizes = "".join(f"{size:8}" for size in SIZES)
    charged = "".join(f"{profile.step.prefill_seconds(size) * 1000:8.2f}" for size in SIZES)
    lines = [
        f"{name}: what a newcomer cost the streams decoding beside it, ms, by its prompt tokens",
        f"  {'':30}{sizes}",
        _costs("the sweep's loaded levels", sweep),
        _costs("the held-apart load, real", held),
        _costs("the held-apart load, replayed", replayed),
        f"  {'the profile charges a step':30}{charged}",
        "the held-apart levels' mean step, ms: what newcomers added + the rest",
        f"  {'level':6} {'real':>22}   {'replayed':>22}",
    ]
    for width, real, replay in zip(recording.widths, held, replayed, strict=True):
        lines.append(f"  x{width:<5} {_split(real)}   {_split(replay)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.calibrate.newcomers", description=__doc__)
    parser.add_argument("recordings", nargs="+", type=Path, metavar="DIR")
    parser.add_argument("--profile", type=Path, help="the profile to replay (default: fit the sweep)")
    parser.add_argument("--refine-s", type=float, default=20.0, help="the fit's refinement budget")
    args = parser.parse_args(argv)

    for directory in args.recordings:
        recording = load(directory)
        profile = load_profile(args.profile) if args.profile else refit(recording, args.refine_s)
        print(report(str(directory), recording, profile))
    return 0


if __name__ == "__main__":
    sys.exit(main())
