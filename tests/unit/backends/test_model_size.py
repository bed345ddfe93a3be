"""A pool's model size, read from its model names, scales the accelerator's 8B priors."""

from __future__ import annotations

import re

import pytest

from backends.model_size import params_b_from_name, params_b_from_names
from backends.models import BackendConfig, PoolConfig, build_backends
from backends.yamlfile import ConfigError
from gateway.config.settings import settings_from_text


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8.0),
        ("llama-3.1-70b", 70.0),
        ("Meta-Llama-3.1-405B-Instruct-FP8", 405.0),
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.5),
        ("facebook/opt-125m", 0.125),
        ("deepseek-r1-distill-qwen-1.5b", 1.5),
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", None),  # a mixture of experts: reads some weights a step
        ("microsoft/phi-3-mini-4k-instruct", None),  # 4k is its context, not its size
        ("acme-support-bot", None),
        ("model-0b", None),
        ("llama-3.1-8b/../70b", 70.0),  # only the last path part is the model's own name
    ],
)
def test_the_size_a_name_states(name: str, size: float | None) -> None:
    assert params_b_from_name(name) == size


def test_a_pool_of_aliases_takes_the_size_one_of_them_states() -> None:
    assert params_b_from_names(["chat", "meta-llama/Llama-3.1-70B-Instruct"]) == 70.0
    assert params_b_from_names(["chat", "support"]) is None


def _pool(models: list[str], accelerator: str = "mi300x", gpus: int = 1, params_b: float | None = None):
    config = PoolConfig(
        name="p",
        vendor="amd",
        accelerator=accelerator,
        price_per_gpu_hour=1.75,
        gpus_per_backend=gpus,
        model_params_b=params_b,
        backends=[BackendConfig(url="http://127.0.0.1:9000", models=models, max_model_len=32768)],
    )
    return build_backends([config])[0].pool


def test_the_priors_scale_with_the_model_and_split_over_tensor_parallel_gpus() -> None:
    small, large = _pool(["llama-3.1-8b"]), _pool(["llama-3.1-70b"])
    assert small.light_load_tpot_s == pytest.approx(0.009) and small.prior_tpot_s == pytest.approx(0.009)
    assert large.light_load_tpot_s == pytest.approx(0.009 * 70 / 8)
    assert large.cost_floor_per_mtok == pytest.approx(small.cost_floor_per_mtok * 70 / 8)
    two = _pool(["llama-3.1-70b"], accelerator="h100", gpus=2)
    assert two.light_load_tpot_s == pytest.approx(0.007 * 70 / 8 / 2)


def test_an_unknown_size_or_accelerator_leaves_no_light_load_time() -> None:
    unnamed = _pool(["acme-support-bot"])
    assert unnamed.light_load_tpot_s is None and unnamed.model_scale == 1.0
    assert unnamed.prior_tpot_s == pytest.approx(0.009)  # the accelerator's own prior, as before
    assert _pool(["llama-3.1-8b"], accelerator="tpu-v5").light_load_tpot_s is None
    assert _pool(["acme-support-bot"], params_b=70).light_load_tpot_s == pytest.approx(0.009 * 70 / 8)


def test_an_unknown_accelerator_scales_its_guessed_priors_by_a_known_size_alike() -> None:
    """Its throughput and its time per token both scale (a 70B pool is not assumed to decode at an 8B's
    speed while costing a 70B's floor); it still sets no light-load time for `max_slowdown`."""
    small = _pool(["llama-3.1-8b"], accelerator="tpu-v5")
    large = _pool(["llama-3.1-70b"], accelerator="tpu-v5")
    assert large.prior_tpot_s == pytest.approx(small.prior_tpot_s * 70 / 8)
    assert large.saturated_tokens_per_s == pytest.approx(small.saturated_tokens_per_s * 8 / 70)
    assert large.light_load_tpot_s is None


@pytest.mark.parametrize(
    ("value", "error"),
    [("0", "> 0.0"), ("-3", "> 0.0"), (".nan", "> 0.0"), (".inf", "<= 10000"), ("big", "`str`")],
)
def test_a_pool_size_that_is_not_a_size_is_refused_at_its_line(value: str, error: str) -> None:
    text = f"""pools:
  - name: m
    vendor: amd
    accelerator: mi300x
    price_per_gpu_hour: 1.75
    model_params_b: {value}
    backends:
      - {{url: "http://127.0.0.1:9", models: [x], max_model_len: 8}}
"""
    with pytest.raises(ConfigError, match=f"g.yaml:6: .*{re.escape(error)}.*model_params_b"):
        settings_from_text(text, "g.yaml")
