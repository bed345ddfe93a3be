"""The simulator's sampler is keyed by the request's sampling key (server seed, request seed, temperature),
a string, not an integer seed: the annotation says so and the key decides the tokens."""

from __future__ import annotations

from typing import get_type_hints

from backends.sim.protocol import GenerationRequest, parse_generation
from backends.sim.text import generate

MODELS = ("m",)
BODY = {"model": "m", "prompt": "the same prompt"}


def _request(server_seed: int, **body: object) -> GenerationRequest:
    return parse_generation("completion", {**BODY, **body}, MODELS, server_seed, 4096)


def _tokens(req: GenerationRequest, index: int = 0) -> list[str]:
    return generate(req.model, req.prompt_key, req.sampling_key, index, None, 4096).tokens


def test_generate_takes_the_requests_sampling_key() -> None:
    assert get_type_hints(generate)["sampling_key"] == get_type_hints(GenerationRequest)["sampling_key"]


def test_the_sampling_key_decides_the_tokens() -> None:
    assert _tokens(_request(0, seed=1)) == _tokens(_request(0, seed=1))
    assert _tokens(_request(0, seed=1)) != _tokens(_request(0, seed=2))
    assert _tokens(_request(0, seed=1)) != _tokens(_request(1, seed=1))
    assert _tokens(_request(0, seed=1), index=0) != _tokens(_request(0, seed=1), index=1)


def test_greedy_ignores_seeds() -> None:
    greedy = _request(0, seed=1, temperature=0)
    assert greedy.sampling_key is None
    assert _tokens(greedy) == _tokens(_request(1, seed=2, temperature=0))
