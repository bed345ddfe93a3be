"""The recorded traffic: the gateway's access log (gateway/telemetry/logs.py) read as requests to replay.

Lines are decoded into the schema the gateway writes them with (`AccessLine`); fields a replay does not
read are kept but ignored. A line gives when the request arrived (its end, `ts`, minus its `duration_s`
and the `queued_s` the gateway held it for room), what it asked for (endpoint, model, prompt tokens,
`max_tokens`, `n`, stream), what classified it (the gateway's prompt estimate, priority, class header,
tenant, key id), hashes of its prompt's start (`affinity`, `prefix`) and what happened (output tokens,
TTFT, duration, backend, class). Lines the gateway refused itself (no backend
answered, so no tokens) are kept as `refused`: a replay cannot know what they would have cost.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from gateway.ledger.records import AccessLine


@dataclass(slots=True)
class Recorded:
    """One request to replay; `at_s` is seconds after the log's first arrival."""

    index: int
    at_s: float
    line: AccessLine
    end_s: float = 0.0
    """When its answer ended in the log (its `ts`), on the same clock as `at_s`."""

    @property
    def output_per_choice(self) -> int:
        n = max(1, self.line.n)
        return max(1, -(-self.line.completion_tokens // n))


@dataclass(slots=True)
class Trace:
    source: str
    requests: list[Recorded]
    duration_s: float
    refused: int = 0
    """Lines the gateway answered itself with an error (no backend served them)."""
    bad_lines: list[str] = field(default_factory=list)
    endpoints: Counter[str] = field(default_factory=Counter)


class LogError(ValueError):
    """An access log that cannot be read at all (the message names the file)."""


_decoder = msgspec.json.Decoder(AccessLine)
MAX_BAD_LINES = 5


def read_log(path: str | Path, scale: float = 1.0) -> Trace:
    """The log's requests in arrival order; `scale` > 1 compresses time (more load, same requests)."""
    path = Path(path)
    try:
        handle = path.open("rb")
    except OSError as exc:
        raise LogError(f"{path}: cannot read access log: {exc.strerror}") from None
    lines: list[AccessLine] = []
    refused = 0
    bad: list[str] = []
    endpoints: Counter[str] = Counter()
    with handle:
        for number, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                line = _decoder.decode(raw)
            except msgspec.DecodeError as exc:
                if len(bad) < MAX_BAD_LINES:
                    bad.append(f"{path}:{number}: {exc}")
                continue
            if not math.isfinite(line.ts):
                continue
            if not line.backend:
                refused += 1
                continue
            endpoints[line.endpoint] += 1
            lines.append(line)
    if not lines:
        raise LogError(f"{path}: no request a backend served (is this a switchyard access log?)")
    arrivals = [line.ts - (line.duration_s or 0.0) - line.queued_s for line in lines]
    order = sorted(range(len(lines)), key=arrivals.__getitem__)
    origin = arrivals[order[0]]
    requests = [
        Recorded(i, (arrivals[j] - origin) / scale, lines[j], (lines[j].ts - origin) / scale)
        for i, j in enumerate(order)
    ]
    duration = max(requests[-1].at_s, 1.0)
    return Trace(str(path), requests, duration, refused, bad, endpoints)
