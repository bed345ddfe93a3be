"""The calibration's timed request (measure.stream_completion): the client's TTFT and time per output
token from the SSE lines as they arrive, and a refusal named, not timed."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web

from loadtest.calibrate.measure import ServerError, stream_client, stream_completion
from tests.support import serving

GAP_S = 0.02


async def _completions(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body["model"] != "m":
        return web.json_response({"error": {"message": "no such model"}}, status=404)
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    await asyncio.sleep(2 * GAP_S)  # the first token
    for index in range(body["max_tokens"]):
        if index:
            await asyncio.sleep(GAP_S)
        chunk = {"choices": [{"text": "x", "index": 0}]}
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def test_a_streamed_completion_is_timed_from_its_sse_lines() -> None:
    app = web.Application()
    app.router.add_post("/v1/completions", _completions)
    async with serving(app) as url, stream_client() as client:
        timed = await stream_completion(client, url, "m", [1, 2, 3], 5, {"x-session-id": "s"})
        assert timed.prompt_tokens == 3 and timed.output_tokens == 5
        assert 2 * GAP_S * 0.9 <= timed.ttft_s < 2 * GAP_S + 0.05
        assert timed.tpot_s == pytest.approx(GAP_S, rel=0.5)
        assert timed.e2e_s >= timed.ttft_s + 4 * GAP_S * 0.9
        with pytest.raises(ServerError, match=r"answered 404: .*no such model"):
            await stream_completion(client, url, "other", [1], 2)
