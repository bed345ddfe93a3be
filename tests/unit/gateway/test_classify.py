"""classify(): the caller's key id and the context a request needs."""

from __future__ import annotations

import json

import pytest

from gateway.request.classify import Caller, classify, key_id
from gateway.request.parse import parse
from policies.profile import DEFAULT_CLASS

KEY = "sk-live-0123456789abcdef"


def test_key_id_never_contains_the_key():
    kid = key_id(f"Bearer {KEY}")
    assert KEY not in kid
    assert "0123456789" not in kid
    assert kid.startswith("key-")
    assert len(kid) == len("key-") + 12


def test_key_id_is_stable_and_distinguishes_keys():
    assert key_id(f"Bearer {KEY}") == key_id(f"Bearer {KEY}")
    assert key_id(f"Bearer {KEY}") == key_id(f"Bearer   {KEY}  ")
    assert key_id("Bearer sk-a") != key_id("Bearer sk-b")
    key_id.cache_clear()
    assert key_id(f"Bearer {KEY}") == key_id(f"Bearer {KEY}")


@pytest.mark.parametrize("header", [None, "", "Bearer ", "Bearer    "])
def test_key_id_anonymous_without_a_key(header: str | None):
    assert key_id(header) == "anonymous"


def _parsed(content: str, **extra: object):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], **extra}
    return parse("chat", json.dumps(body).encode())


def test_classify_profile():
    profile = classify(_parsed("x" * 40, max_tokens=100, stream=True), Caller("req-1", f"Bearer {KEY}", {}))
    assert profile.model == "m"
    assert profile.prompt_tokens_estimate == 10
    assert profile.context_needed == 110
    assert profile.stream is True
    assert profile.key_id == key_id(f"Bearer {KEY}")
    assert profile.request_class == DEFAULT_CLASS


@pytest.mark.parametrize(
    ("chars", "max_tokens", "needed"),
    [(0, None, 1), (1, None, 2), (4, None, 2), (5, None, 3), (400, 50, 150), (401, 50, 151)],
)
def test_context_needed(chars: int, max_tokens: int | None, needed: int):
    extra = {"max_tokens": max_tokens} if max_tokens else {}
    assert classify(_parsed("y" * chars, **extra), Caller("req-1", None, {})).context_needed == needed


def test_context_needed_uses_max_completion_tokens():
    parsed = _parsed("z" * 8, max_tokens=10, max_completion_tokens=30)
    assert classify(parsed, Caller("req-1", None, {})).context_needed == 2 + 30


def test_anonymous_profile():
    assert classify(_parsed("hi"), Caller("req-1", None, {})).key_id == "anonymous"


def test_key_id_scheme_is_case_insensitive():
    assert key_id(f"bearer {KEY}") == key_id(f"Bearer {KEY}")
