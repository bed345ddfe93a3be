"""The prompt-size estimate: characters per token learned per model and key from the backends' counts."""

from __future__ import annotations

import json

from gateway.request import prompt_size
from gateway.request.classify import Caller, classify
from gateway.request.parse import parse
from gateway.request.prompt_size import BOUNDS, DEFAULT_CHARS_PER_TOKEN, PromptSizer


def test_an_untaught_sizer_estimates_four_characters_a_token_rounded_up() -> None:
    sizer = PromptSizer()
    assert sizer.chars_per_token("m", "k") == DEFAULT_CHARS_PER_TOKEN == 4.0
    assert [sizer.estimate("m", "k", chars) for chars in (0, 1, 4, 5, 25_088)] == [0, 1, 1, 2, 6272]


def test_counted_prompts_move_the_estimate_to_the_tokenizers_figure() -> None:
    sizer = PromptSizer()
    for _ in range(10):  # 10 prompts of 10k tokens at 5 characters a token
        sizer.learn("m", "k", 50_000, 10_000)
    # the default weighs as 8k tokens against the 100k counted
    assert 4.9 < sizer.chars_per_token("m", "k") < 5.0
    assert 5_020 < sizer.estimate("m", "k", 25_000) < 5_110  # 6,250 at 4 a token


def test_older_counts_fade_so_the_estimate_follows_text_that_changes() -> None:
    sizer = PromptSizer()
    for _ in range(40):
        sizer.learn("m", "k", 50_000, 10_000)  # 5 a token
    for _ in range(60):
        sizer.learn("m", "k", 20_000, 10_000)  # then code or another language: 2 a token
    assert sizer.chars_per_token("m", "k") < 2.2


def test_each_key_and_model_learns_alone() -> None:
    """No caller's text moves another caller's estimates."""
    sizer = PromptSizer()
    for _ in range(20):
        sizer.learn("m", "attacker", 6_000_000, 10_000)  # a prompt of few, long tokens
    assert sizer.chars_per_token("m", "attacker") == BOUNDS[1]
    assert sizer.chars_per_token("m", "victim") == 4.0
    assert sizer.chars_per_token("other-model", "attacker") == 4.0


def test_the_figure_stays_within_its_bounds_and_ignores_empty_counts() -> None:
    sizer = PromptSizer()
    for _ in range(50):
        sizer.learn("m", "k", 1_000, 10_000)  # ten tokens a character
    assert sizer.chars_per_token("m", "k") == BOUNDS[0]
    sizer.learn("m", "fresh", 0, 100)
    sizer.learn("m", "fresh", 100, 0)
    sizer.learn("m", "fresh", -5, -5)
    assert sizer.chars_per_token("m", "fresh") == 4.0


def test_it_remembers_a_bounded_number_of_keys_forgetting_the_oldest(monkeypatch) -> None:
    monkeypatch.setattr(prompt_size, "MAX_TALLIES", 3)
    sizer = PromptSizer()
    for key in ("a", "b", "c"):
        sizer.learn("m", key, 500_000, 100_000)
    sizer.learn("m", "a", 500_000, 100_000)  # a is learned again: b is now the oldest
    sizer.learn("m", "d", 500_000, 100_000)
    assert sizer.chars_per_token("m", "b") == 4.0
    assert all(sizer.chars_per_token("m", key) > 4.5 for key in ("a", "c", "d"))


def test_classification_reads_the_callers_own_figure() -> None:
    sizer = PromptSizer()
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 30_000}]}
    parsed = parse("chat", json.dumps(body).encode())
    taught = Caller(request_id="r1", authorization="Bearer sk-taught", forwarded={})
    other = Caller(request_id="r2", authorization="Bearer sk-other", forwarded={})
    for _ in range(10):
        sizer.learn("m", classify(parsed, taught, sizer).key_id, 30_000, 6_000)
    profile = classify(parsed, taught, sizer)
    assert 6_000 <= profile.prompt_tokens_estimate < 6_300
    assert profile.context_needed == profile.prompt_tokens_estimate + 1
    assert classify(parsed, other, sizer).prompt_tokens_estimate == 7_500
