"""Is the machine still as fast as when the profile was measured? A probe before and after each real level.

A profile describes the server at the speed the machine ran it during the sweep. On a machine it shares
with other work (CI's two cores run the servers, the gateway and the load generator), that speed moves,
and a level measured while it had moved compares the simulator with a different machine. The probe is
the sweep's simplest measurement repeated: a few requests one at a time, and vLLM's own mean inter-token
latency over them (one decode step of one sequence), held against the same figure of the sweep (the
median of its one-at-a-time levels). A level whose probe before or after it is off by more than
`SPEED_TOLERANCE` is run again (at most `ATTEMPTS` times); the attempt whose probes were closest is kept,
and every attempt is reported. Nothing here looks at the simulator: the probe judges the real run only.
"""

from __future__ import annotations

import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from backends.calibrated import CalibratedProfile
from loadtest.calibrate.measure import Server, histogram_mean, stream_completion

PROBE_PROMPT, PROBE_OUTPUT, PROBE_REQUESTS = 64, 32, 3
SPEED_TOLERANCE = 0.15
ATTEMPTS = 3
ITL = "vllm:inter_token_latency_seconds"


def calibration_speed(profile: CalibratedProfile) -> float | None:
    """The sweep's single-stream decode step: the median inter-token latency of its levels of one request
    at a time (None when it has none)."""
    single = [p.measured_s for p in profile.points if p.kind == "tpot" and p.concurrency == 1]
    return statistics.median(single) if single else None


@dataclass(slots=True)
class Attempt:
    level: str
    before_s: float
    after_s: float
    started: float
    """Unix time (the access log's clock)."""
    ended: float

    def deviation(self, baseline_s: float) -> float:
        return max(abs(self.before_s / baseline_s - 1), abs(self.after_s / baseline_s - 1))


@dataclass(slots=True)
class SpeedGate:
    url: str
    model: str
    baseline_s: float
    vocabulary: list[int]
    tolerance: float = SPEED_TOLERANCE
    attempts: int = ATTEMPTS
    seed: int = 0
    log: list[Attempt] = field(default_factory=list)
    kept: list[Attempt] = field(default_factory=list)

    async def probe(self, client: httpx.AsyncClient) -> float:
        """vLLM's mean inter-token latency over a few requests sent one at a time."""
        rng = random.Random(self.seed + len(self.log))
        server = Server(self.url, self.model)
        try:
            before = await server.metrics()
            for _ in range(PROBE_REQUESTS):
                prompt = [rng.choice(self.vocabulary) for _ in range(PROBE_PROMPT)]
                await stream_completion(client, self.url, self.model, prompt, PROBE_OUTPUT)
            after = await server.metrics()
        finally:
            await server.close()
        return histogram_mean(before, after, ITL)[0]

    def ok(self, attempt: Attempt) -> bool:
        return attempt.deviation(self.baseline_s) <= self.tolerance

    def describe(self) -> str:
        lines = [f"machine speed (vLLM's single-stream ITL; the sweep's {self.baseline_s * 1000:.2f} ms):"]
        for a in self.log:
            mark = "kept" if a in self.kept else "run again" if not self.ok(a) else ""
            lines.append(
                f"  {a.level:4} before {a.before_s * 1000:6.2f} ms, after {a.after_s * 1000:6.2f} ms "
                f"({a.deviation(self.baseline_s):5.1%} off) {mark}"
            )
        return "\n".join(lines)

    def accepted(self, arrival: float) -> bool:
        """Whether a request that arrived at `arrival` (Unix time) belongs to a kept attempt."""
        return any(a.started <= arrival <= a.ended for a in self.kept)


def now() -> float:
    return time.time()


def kept_log(log: Path, gate: SpeedGate, out: Path) -> Path:
    """A copy of a gateway's access log with only the requests of the kept attempts (a level run again
    leaves its first try's lines in the log; the replay must see the run that was compared)."""
    with log.open("rb") as source, out.open("wb") as sink:
        for raw in source:
            try:
                line = json.loads(raw)
                arrival = (
                    float(line["ts"])
                    - float(line.get("duration_s") or 0.0)
                    - float(line.get("queued_s") or 0.0)
                )
            except (ValueError, KeyError, TypeError):
                continue
            if gate.accepted(arrival):
                sink.write(raw)
    return out
