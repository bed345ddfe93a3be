"""Bodies vLLM cannot parse (invalid UTF-8, nesting past Python's recursion limit) get its 400, never 500."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from backends.sim.app import start_server
from backends.sim.options import SimOptions

MODEL = "llama-3.1-8b"


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    server = await start_server(SimOptions(models=(MODEL,), ttft_ms=1, tpot_ms=0.5))
    async with httpx.AsyncClient(base_url=server.url, trust_env=False) as client:
        yield client
    await server.close()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (
            "/v1/chat/completions",
            b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hel\xfflo"}]}',
        ),
        (
            "/v1/chat/completions",
            b'{"model":"llama-3.1-8b","messages":[{"role":"user","content":"hi"}],"x":"\xff","stream":true}',
        ),
        ("/v1/completions", b'{"model":"llama-3.1-8b","prompt":"\xc3"}'),
        ("/v1/embeddings", b'{"model":"llama-3.1-8b","input":"\xed\xa0\x80"}'),
        ("/v1/chat/completions", b'{"model":"llama-3.1-8b","x":' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ],
)
async def test_unparseable_bodies_get_vllms_400(http: httpx.AsyncClient, path: str, body: bytes) -> None:
    response = await http.post(path, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    # What vLLM 0.32's FastAPI app answers before any handler runs (tests/vllm checks it on real vLLM).
    assert response.json() == {"detail": "There was an error parsing the body"}
