"""How steady each CPU's speed is, second by second: a fixed piece of Python work counted per second on
every CPU at once, before anything of the check runs.

A real server is one server only if its machine holds one speed. On a virtual machine a core can run at
half its speed for ten seconds and then recover, whatever the guest does (other guests of the host; the
guest's steal time does not show it), and each core on its own (docs/calibrate.md, 2026-11-29, 06:00
UTC: an idle two-core Xeon whose cores each moved 1.6-2.3 times from one second to the next, one of them
at half speed for ten seconds while the other was not). A profile fitted in some of those seconds and held
against others cannot agree within the check's 20 %, and what the check then reports is the machine.
`switchyard calibrate`'s own warning (`levels.steadiness`) reads the server's single-stream levels over the
sweep; this reads the machine alone, so a failed check can be told apart from a wrong profile.

Usage: python -m loadtest.calibrate.core_speed [--seconds 20] [--tolerance 0.2]
       Exit status 0 when every CPU held within the tolerance of its own median in every second, 1 when
       not.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from backends.lifetime import die_with_parent

_MODULE = "loadtest.calibrate.core_speed"

TOLERANCE = 0.2
"""The check's own bound (check.TOLERANCE): a second more than this below or above the median is a second
of another machine."""


def _work() -> int:
    total = 0
    for i in range(2_000):
        total += i * i
    return total


def count_per_second(seconds: int) -> list[int]:
    """How many times the fixed work ran in each of `seconds` seconds, on the calling thread's CPU."""
    counts = []
    clock = time.perf_counter
    for _ in range(seconds):
        start, done = clock(), 0
        while clock() - start < 1.0:
            _work()
            done += 1
        counts.append(done)
    return counts


@dataclass(frozen=True, slots=True)
class CoreSpeed:
    """One CPU's count of the fixed work, second by second."""

    cpu: int
    per_second: tuple[int, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.per_second)

    @property
    def slowest(self) -> float:
        """The slowest second as a share of the median second."""
        return min(self.per_second) / self.median

    @property
    def fastest(self) -> float:
        return max(self.per_second) / self.median

    def off_seconds(self, tolerance: float = TOLERANCE) -> int:
        """Seconds more than `tolerance` from the median, either way."""
        median = self.median
        return sum(abs(count / median - 1.0) > tolerance for count in self.per_second)

    def longest_slow(self, tolerance: float = TOLERANCE) -> int:
        """The longest run of consecutive seconds more than `tolerance` below the median."""
        floor = self.median * (1.0 - tolerance)
        longest = run = 0
        for count in self.per_second:
            run = run + 1 if count < floor else 0
            longest = max(longest, run)
        return longest

    def steady(self, tolerance: float = TOLERANCE) -> bool:
        return self.off_seconds(tolerance) == 0

    def describe(self, tolerance: float = TOLERANCE) -> str:
        return (
            f"cpu{self.cpu}: {len(self.per_second)} s, slowest second {self.slowest:.2f} and fastest "
            f"{self.fastest:.2f} of the median, {self.off_seconds(tolerance)} s more than "
            f"{tolerance:.0%} off it (longest slow stretch {self.longest_slow(tolerance)} s)"
        )


def measure(seconds: int, cpus: Iterable[int] | None = None) -> list[CoreSpeed]:
    """Each of `cpus` (default: every CPU this process may run on) counted at once, one process pinned to
    each, so every core is loaded as it is when the server and its clients run; the processes end with
    this one."""
    chosen = sorted(os.sched_getaffinity(0) if cpus is None else cpus)
    workers = [
        (
            cpu,
            subprocess.Popen(
                [sys.executable, "-m", _MODULE, "--worker", str(cpu), "--seconds", str(seconds)],
                stdout=subprocess.PIPE,
                preexec_fn=die_with_parent(),
            ),
        )
        for cpu in chosen
    ]
    speeds = []
    try:
        for cpu, worker in workers:
            out, _ = worker.communicate(timeout=seconds + 30)
            if worker.returncode != 0:
                raise RuntimeError(f"the speed meter on cpu{cpu} exited with {worker.returncode}")
            speeds.append(CoreSpeed(cpu, tuple(json.loads(out))))
    finally:
        for _, worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
    return speeds


def unsteady(speeds: Sequence[CoreSpeed], tolerance: float = TOLERANCE) -> list[CoreSpeed]:
    """The CPUs that did not hold one speed within `tolerance` of their median."""
    return [speed for speed in speeds if not speed.steady(tolerance)]


def report(speeds: Sequence[CoreSpeed], tolerance: float = TOLERANCE) -> list[str]:
    """A line per CPU, then the verdict."""
    lines = [speed.describe(tolerance) for speed in speeds]
    off = ", ".join(f"cpu{speed.cpu}" for speed in unsteady(speeds, tolerance))
    if off:
        lines.append(
            f"warning: {off} did not hold one speed within {tolerance:.0%} with nothing else "
            "running; a server on this machine is not one server, and the check's rows and attainment "
            "measure the machine as much as the profile"
        )
    else:
        lines.append(f"every CPU held its speed within {tolerance:.0%} of its median, second by second")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=int, default=20, help="how long to count (default 20)")
    parser.add_argument("--tolerance", type=float, default=TOLERANCE, help="the check's bound (default 0.2)")
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.seconds < 1:
        parser.error("--seconds wants a whole number of at least 1")
    if not 0 < args.tolerance < 1:
        parser.error("--tolerance wants a share between 0 and 1, such as 0.2")
    if args.worker is not None:  # one CPU's counter, started by `measure`
        os.sched_setaffinity(0, {args.worker})
        print(json.dumps(count_per_second(args.seconds)))
        return 0
    speeds = measure(args.seconds)
    for line in report(speeds, args.tolerance):
        print(line)
    return 1 if unsteady(speeds, args.tolerance) else 0


if __name__ == "__main__":
    sys.exit(main())
