"""The backend's own count of a request's prompt tokens (vLLM's `POST /tokenize`).

For streams that ended before their usage chunk; runs after the request, never on its path, over the
aiohttp session the gateway keeps for calls off the request path.
"""

from __future__ import annotations

import aiohttp
import msgspec

from backends.models import Backend
from gateway.request.parse import ParsedRequest
from gateway.upstream.request import auth_header

TOKENIZE_TIMEOUT_S = 2.0


async def count_prompt_tokens(
    session: aiohttp.ClientSession, backend: Backend, parsed: ParsedRequest
) -> int | None:
    """The prompt's token count, or None when the request has no prompt to count or the backend cannot say."""
    try:
        request = msgspec.json.decode(parsed.body)
    except msgspec.DecodeError:
        return None
    body: dict[str, object] = {"model": parsed.model}
    if parsed.endpoint == "chat" and isinstance(request.get("messages"), list):
        body["messages"] = request["messages"]
    elif parsed.endpoint == "completions" and isinstance(request.get("prompt"), str):
        body["prompt"] = request["prompt"]
    else:
        return None
    try:
        async with session.post(
            backend.url + "/tokenize",
            json=body,
            headers=auth_header(backend),
            timeout=aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S),
        ) as response:
            if response.status != 200:
                return None
            count = (await response.json()).get("count")
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return count if isinstance(count, int) and count >= 0 else None
