"""`policy.clock_scale`: latencies the gateway measures are put on the backends' clock before routing
learns from them, so a fleet running faster than real time is judged against its SLOs honestly."""

from __future__ import annotations

import msgspec
import pytest

from backends.sim.fleet import Fleet
from backends.yamlfile import ConfigError
from gateway.app import SwitchyardPlugin
from gateway.config.settings import settings_from_text
from gateway.ledger.records import UsageRecord
from gateway.request.drift import observe
from loadtest.scenario import DEMO_FLEET, load_fleet_spec
from loadtest.stack import gateway_config
from policies.predict import predicted_tpot, predicted_ttft
from tests.support import ONE_POOL as POOLS


def _stream(ttft: float, duration: float, tokens: int) -> UsageRecord:
    return UsageRecord(
        request_id="r",
        endpoint="chat",
        model="m",
        backend="h100-0",
        pool="h100",
        vendor="nvidia",
        accelerator="h100",
        key="k",
        request_class="chat",
        route="r/chat",
        stream=True,
        status=200,
        prompt_tokens=100,
        completion_tokens=tokens,
        usage_source="backend",
        ttft_s=ttft,
        duration_s=duration,
        cost_usd=0.0,
        finished_at=0.0,
    )


def test_default_is_the_real_clock() -> None:
    assert settings_from_text(POOLS).policy_options.clock_scale == 1.0


@pytest.mark.parametrize("bad", ["0", "-2", "fast"])
def test_a_clock_scale_that_is_not_positive_stops_start_up(bad: str) -> None:
    with pytest.raises(ConfigError, match="clock_scale"):
        settings_from_text(f"policy: {{clock_scale: {bad}}}\n" + POOLS)


def test_a_scaled_observation_predicts_a_scaled_ttft() -> None:
    real = settings_from_text(POOLS).backends[0]
    scaled = settings_from_text("policy: {clock_scale: 4}\n" + POOLS).backends[0]
    answer = _stream(ttft=0.05, duration=0.05 + 99 * 0.005, tokens=100)
    observe(real, answer)
    observe(scaled, answer, 4.0)
    assert scaled.observed.ttft == pytest.approx(0.2)
    assert predicted_ttft(scaled) == pytest.approx(4 * predicted_ttft(real))
    assert predicted_tpot(scaled) == pytest.approx(4 * predicted_tpot(real)) == pytest.approx(0.02)


def test_the_load_test_puts_its_gateway_on_the_fleets_clock() -> None:
    spec = msgspec.structs.replace(load_fleet_spec(DEMO_FLEET), time_scale=4.0)
    config = gateway_config(Fleet(spec), DEMO_FLEET, 8080)
    assert config["policy"]["clock_scale"] == 4.0


def test_the_gateway_runs_on_the_configured_clock() -> None:
    plugin = SwitchyardPlugin(settings_from_text("policy: {clock_scale: 3}\n" + POOLS))
    assert plugin.pipeline.clock_scale == 3.0
