"""How busy this machine's CPUs were while a leg of the check ran (Linux `/proc/stat`).

Where the real server and its clients share cores, as in `make test-calibrate` on two cores, the real
leg's timings are partly the machine's: the CPU build's engine computes on one core and its API server,
the gateway and the measuring client share the other, and a busy shared core delays every hop of a
request. The simulated legs load that core far less (the simulator's process does a fraction of the API
server's work per token), so when the real leg's shared core ran near full, a miss says as much about the
machine as about the profile. `BusyMeter` measures it over the stretches it is told, and says it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

STAT = Path("/proc/stat")


def cpu_times(stat: Path = STAT) -> dict[str, tuple[int, int]]:
    """Per CPU (`cpu0`, `cpu1`, ...): (busy, total) clock ticks since boot; empty where unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return {}
    times = {}
    for line in lines:
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        ticks = [int(value) for value in rest.split()][:8]  # a guest's time is in user's already
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle and waiting for I/O
        times[name] = (sum(ticks) - idle, sum(ticks))
    return times


class BusyMeter:
    """Each CPU's busy share over the stretches measured (`measuring`), added together."""

    def __init__(self, stat: Path = STAT) -> None:
        self._stat = stat
        self._busy: dict[str, int] = {}
        self._total: dict[str, int] = {}

    @contextlib.contextmanager
    def measuring(self) -> Iterator[None]:
        before = cpu_times(self._stat)
        try:
            yield
        finally:
            after = cpu_times(self._stat)
            for cpu, (busy, total) in after.items():
                if cpu in before:
                    self._busy[cpu] = self._busy.get(cpu, 0) + busy - before[cpu][0]
                    self._total[cpu] = self._total.get(cpu, 0) + total - before[cpu][1]

    def shares(self) -> dict[str, float]:
        """Per CPU, the busy share of the time measured (none where nothing was)."""
        return {cpu: self._busy[cpu] / total for cpu, total in self._total.items() if total > 0}

    def describe(self) -> str:
        shares = self.shares()
        if not shares:
            return "not measured"
        return ", ".join(
            f"{cpu} {share:.0%}" for cpu, share in sorted(shares.items(), key=lambda c: int(c[0][3:]))
        )
