"""`loadtest --find-capacity --virtual`: a scenario's point replayed on the virtual clock, the load test's
report, and the gateway's in-flight counts (by class too) mirrored and given back."""

from __future__ import annotations

from pathlib import Path

from loadtest.capacity import _point
from loadtest.scenario import load_scenario, with_overrides
from loadtest.whatif import points
from loadtest.whatif.simfleet import build_fleet


def test_a_virtual_point_reports_every_class_and_gives_every_slot_back(tmp_path: Path, monkeypatch) -> None:
    fleets = []

    def keep(spec):  # the fleet the point replays on, to read its backends' counts afterwards
        fleets.append(build_fleet(spec))
        return fleets[-1]

    monkeypatch.setattr(points, "build_fleet", keep)
    scenario = with_overrides(load_scenario("mixed"), rate=6, duration_s=20)
    report = points.replay_point(scenario, "balanced", tmp_path / "p")
    assert set(report["classes"]) == {"chat", "long-context", "batch"}
    assert all(m["requests"] > 0 for m in report["classes"].values())
    assert report["cost"]["usd_per_mtok"] > 0
    assert _point(6, [report])["worst"] > 0.9  # a light load meets every SLO
    backends = [s.backend for s in fleets[0]]
    seen = {cls for b in backends for cls in b.inflight_by_class}
    assert {"interactive", "long-context", "batch"} <= seen  # counted by the policy's classes
    assert all(b.inflight == 0 and not any(b.inflight_by_class.values()) for b in backends)
    assert all(not any(b.prompt_tokens_by_class.values()) for b in backends)  # every token given back
    assert any(b.prompt_tokens_by_class for b in backends)
