"""Routing past capacity, on the virtual-clock replay of the load-test scenarios (issue 18).

The replay runs the real policy engine against the simulator's scheduler and GPU model, so these pin what
the `balanced` preset does with a fleet's limits, not a mock of it:
- in a burst of 3x the rate, batch jobs sent at once slow every decode step of the burst's chat: batch
  waits, chat keeps its SLO (round robin, sending batch at once, loses 15% of the chat there), and past
  the fleet's capacity batch is refused with 429 while chat keeps its SLO;
- past what the MI300X can prefill, long prompts are refused with 429, never left to time out, and chat
  on the H100s keeps its SLO; held while a backend decodes slowly, long-context falls with load instead of
  off a cliff.
"""

from __future__ import annotations

from pathlib import Path

from loadtest.scenario import load_scenario, with_overrides
from loadtest.whatif.points import replay_point
from tests.unit.policies.test_overload import unmarked_balanced


def _classes(scenario: str, policy: str, rate: float, duration_s: float, where: Path) -> dict:
    point = with_overrides(load_scenario(scenario), rate=rate, duration_s=duration_s)
    return replay_point(point, policy, where / Path(policy).stem)["classes"]


def test_batch_waits_through_a_burst_and_chat_keeps_its_slo(tmp_path: Path) -> None:
    # 75/s with bursts of 225/s for 5 s at 0 and 30 s on the demo fleet (vLLM's 1,024 seats per GPU): sent
    # at once, n=4 batch jobs of ~600 tokens swell every decode step, and the burst's chat decodes past its
    # 60 ms TPOT (balanced 98%, round robin 85% on this replay: its chat TPOT p90 66 ms, TTFT p99 0.75 s).
    balanced = _classes("bursty", "balanced", 75, 35, tmp_path)
    blind = _classes("bursty", "round-robin", 75, 35, tmp_path)
    assert balanced["chat"]["slo_attainment"] >= 0.97
    assert blind["chat"]["slo_attainment"] < 0.9
    # batch waited (its SLO is 60 s end to end) and was served; what could not wait was refused, not lost
    assert balanced["batch"]["slo_attainment"] >= 0.9
    assert set(balanced["batch"]["error_kinds"]) <= {"refused (429)"}


def test_past_round_robins_capacity_chat_keeps_its_slo_and_past_the_fleets_batch_is_refused(
    tmp_path: Path,
) -> None:
    # Three bursts. Round robin's capacity on this replay is 62.5/s; at 82/s (1.3x) its chat meets 50%.
    # Balanced spreads each burst's chat over every backend predicted to meet its SLO: 98% at 82/s.
    at_capacity = _classes("bursty", "balanced", 82, 65, tmp_path)
    assert at_capacity["chat"]["slo_attainment"] >= 0.95
    assert at_capacity["batch"]["slo_attainment"] >= 0.95
    # 104/s, 1.25x balanced's capacity: batch, the class shed first, is refused and chat keeps its SLO.
    past = _classes("bursty", "balanced", 104, 65, tmp_path)
    assert past["chat"]["slo_attainment"] >= 0.9  # 93.5% here
    assert past["batch"]["error_kinds"].get("refused (429)", 0) >= 100  # 340 here
    assert set(past["batch"]["error_kinds"]) == {"refused (429)"}


def test_past_the_mi300x_long_prompts_get_429s_and_chat_keeps_its_slo(tmp_path: Path) -> None:
    # `mixed` at 40/s: 1.45x balanced's capacity, bound by the long prompts only the MI300X serve. (At
    # 32.5/s, 92% are served within their SLO and 29 refused.)
    classes = _classes("mixed", "balanced", 40, 60, tmp_path)
    assert classes["chat"]["slo_attainment"] >= 0.95
    refused = classes["long-context"]["error_kinds"]
    assert refused.get("refused (429)", 0) >= 30  # 76 here
    assert set(refused) == {"refused (429)"}
    assert set(classes["batch"]["error_kinds"]) <= {"refused (429)"}


def test_held_while_the_mi300x_decode_slowly_long_context_falls_with_load_not_off_a_cliff(
    tmp_path: Path,
) -> None:
    # `mixed` at 31.25/s, past balanced's capacity. Without the decode mark the long prompts are sent while
    # the MI300X decode slowly, slow steps keep more sequences in flight, which slow the steps further:
    # 37% of them meet their SLO. With it (`max_slowdown: 6`: 54 ms a token for an 8B model on an MI300X)
    # they wait (then 429) while decoding recovers: 85%. (At 28.75/s, before the prompt-size estimate was
    # learned and the long prompts that fit 8k went to the H100s too, it was 53% against 92%; now 84/93%.)
    held = _classes("mixed", "balanced", 31.25, 90, tmp_path)
    assert held["long-context"]["slo_attainment"] >= 0.8
    assert set(held["long-context"]["error_kinds"]) <= {"refused (429)"}
    assert held["chat"]["slo_attainment"] >= 0.99
    unmarked = tmp_path / "unmarked.yaml"
    unmarked.write_text(unmarked_balanced())
    sent = _classes("mixed", str(unmarked), 31.25, 90, tmp_path)
    assert sent["long-context"]["slo_attainment"] < 0.6
