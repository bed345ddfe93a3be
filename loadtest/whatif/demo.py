"""`make whatif-demo`: a log of the `mixed` scenario's traffic, replayed under `balanced` and `cheapest`.

The log is written as the gateway writes its access log (loadtest/whatif/synth.py), without serving it
first; `switchyard whatif --log` takes a real one the same way.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from loadtest.scenario import load_scenario
from loadtest.stack import policy_file
from loadtest.whatif.accesslog import read_log
from loadtest.whatif.compare import print_report, whatif
from loadtest.whatif.synth import write_log
from loadtest.workload import plan


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    scenario = load_scenario(args[0] if args else "mixed")
    out = Path(tempfile.mkdtemp(prefix="switchyard-whatif-demo-"))
    log = write_log(plan(scenario), out / "access.jsonl")
    slos = {c.name: c.slo for c in scenario.spec.classes}
    report = whatif(
        read_log(log),
        scenario.fleet,
        ("balanced", policy_file("balanced")),
        ("cheapest", policy_file("cheapest")),
        out,
        slos,
    )
    print_report(report)
    print(f"\nlog: {log}\nreport: {out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
