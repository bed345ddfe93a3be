"""Hypothesis-built bodies for every POST endpoint: near-valid requests with hostile values mixed in.

Every answer is a 2xx or a non-5xx error in OpenAI's shape, and a refused request is not counted.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.conftest import ENDPOINTS, MODEL, FuzzGateway, assert_openai_error, wait_for_count

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False),
    st.text(max_size=20),
)
_json = st.recursive(
    _scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
_counts = st.one_of(st.integers(min_value=-3, max_value=12), st.just(2**63), st.just(2**64 + 1), _scalars)
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", ""]) | st.text(max_size=5), "content": _json}
)
_fields = {
    "model": st.just(MODEL) | st.text(max_size=10) | _scalars,
    "messages": st.lists(_message, max_size=20) | _json,
    "prompt": st.text(max_size=50) | st.lists(st.integers(0, 50_000), max_size=10) | _json,
    "input": st.text(max_size=50) | st.lists(st.text(max_size=10), max_size=8) | _json,
    "n": _counts,
    "max_tokens": _counts,
    "max_completion_tokens": _counts,
    "best_of": _counts,
    "logprobs": _counts,
    "top_logprobs": _counts,
    "stream": st.booleans() | _scalars,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | _scalars}) | _json,
    "metadata": _json,
    "user": _scalars,
    "unknown_field": _json,
}


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    chosen = draw(st.sets(st.sampled_from(sorted(_fields)), max_size=7))
    data: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "prompt": "hi"}
    data["input"] = "hi"
    for name in chosen:
        data[name] = draw(_fields[name])
    body = json.dumps(data).encode()
    mangle = draw(st.sampled_from(["none", "none", "byte", "nest", "cut"]))
    if mangle == "byte":  # a raw byte that is not UTF-8, inside a string
        at = body.find(b'"hi"')
        body = (
            body[: at + 2] + bytes([draw(st.sampled_from([0x80, 0xC3, 0xED, 0xF8, 0xFF]))]) + body[at + 2 :]
        )
    elif mangle == "nest":
        depth = draw(st.integers(min_value=500, max_value=5000))
        body = body[:-1] + b', "deep": ' + b"[" * depth + b"]" * depth + b"}"
    elif mangle == "cut":
        body = body[: draw(st.integers(min_value=0, max_value=len(body) - 1))]
    return body


@pytest.fixture(scope="module")
def http(fuzz_gateway: FuzzGateway) -> Any:
    with httpx.Client(base_url=fuzz_gateway.base_url, timeout=15) as client:
        yield client


@pytest.mark.parametrize("path", ENDPOINTS)
def test_generated_bodies(fuzz_gateway: FuzzGateway, http: httpx.Client, path: str) -> None:
    before = fuzz_gateway.requests_counted()
    served = 0

    @settings(max_examples=50, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(body=bodies())
    def check(body: bytes) -> None:
        nonlocal served
        response = http.post(path, content=body, headers={"content-type": "application/json"})
        if response.status_code >= 300:
            assert_openai_error(
                response.status_code, response.headers.get("content-type", ""), response.content
            )
        else:
            assert response.status_code == 200
            served += path != "/admin/v1/explain"

    check()
    wait_for_count(fuzz_gateway, before + served)  # refused requests are not counted
    assert set(fuzz_gateway.breakers().values()) == {"closed"}
