"""One streamed chat completion through the gateway, timed from the client's side.

TTFT is the time to the first chunk carrying generated text (not the role chunk); time per output token
is the rest of the stream over the tokens after the first, per choice; usage comes from the stream's
usage chunk, the only event decoded. Where the gateway sent the request comes from its
`x-switchyard-*` response headers.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import aiohttp
import msgspec

from loadtest.workload import PlannedRequest

_TOKEN_MARK = b'"delta":{"content":"'
_ERROR_MARK = b'"error":'
_USAGE_MARK = b'"usage":{'


class _Usage(msgspec.Struct):
    prompt_tokens: int = 0
    completion_tokens: int = 0


class _UsageEvent(msgspec.Struct):
    usage: _Usage | None = None


_usage_decoder = msgspec.json.Decoder(_UsageEvent)


@dataclass(slots=True)
class Outcome:
    """What happened to one request; times in real seconds (the runner scales them)."""

    index: int
    request_class: str
    sent_at: float
    """Seconds after the start of the run that the request was sent."""
    status: int = 0
    error: str | None = None
    ttft: float | None = None
    e2e: float | None = None
    tpot: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    backend: str | None = None
    pool: str | None = None
    vendor: str | None = None
    route: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _usage_from(event_block: bytes) -> _Usage | None:
    for line in event_block.split(b"\n"):
        if line.startswith(b"data: {") and _USAGE_MARK in line:
            try:
                return _usage_decoder.decode(line[6:]).usage
            except msgspec.DecodeError:
                return None
    return None


async def send(session: aiohttp.ClientSession, url: str, request: PlannedRequest, started: float) -> Outcome:
    """POST `request` to `url` and read the stream to its end; never raises for HTTP or stream errors."""
    begin = time.monotonic()
    outcome = Outcome(index=request.index, request_class=request.request_class, sent_at=begin - started)
    try:
        async with session.post(url, data=request.body, headers=request.headers) as response:
            outcome.status = response.status
            headers = response.headers
            outcome.backend = headers.get("x-switchyard-backend")
            outcome.pool = headers.get("x-switchyard-pool")
            outcome.vendor = headers.get("x-switchyard-vendor")
            outcome.route = headers.get("x-switchyard-route")
            if response.status != 200:
                outcome.error = "refused (429)" if response.status == 429 else f"http {response.status}"
                await response.read()
                outcome.e2e = time.monotonic() - begin
                return outcome
            if not request.stream:
                body = await response.read()
                outcome.e2e = outcome.ttft = time.monotonic() - begin
                try:
                    usage = _usage_decoder.decode(body).usage
                except msgspec.DecodeError:
                    usage = None
                return _finished(outcome, usage, request.n)
            previous = b""
            last: list[bytes] = []
            async for chunk in response.content.iter_any():
                if outcome.ttft is None and _TOKEN_MARK in previous[-32:] + chunk:
                    outcome.ttft = time.monotonic() - begin
                previous = chunk
                last.append(chunk)
                if len(last) > 8:
                    del last[:4]
            end = b"".join(last)
            usage = _usage_from(end)
            if _ERROR_MARK in end[-2048:] and usage is None:
                outcome.error = "stream error"
            outcome.e2e = time.monotonic() - begin
    except (TimeoutError, aiohttp.ClientError, ConnectionError) as exc:
        outcome.error = f"{type(exc).__name__}"
        outcome.e2e = time.monotonic() - begin
        return outcome
    if outcome.error is not None:
        return outcome
    return _finished(outcome, usage, request.n)


def _finished(outcome: Outcome, usage: _Usage | None, n: int) -> Outcome:
    """Tokens and time per output token from the usage; a JSON answer's tpot is its whole time per token."""
    if usage is None:
        outcome.error = "no usage"
        return outcome
    outcome.prompt_tokens = usage.prompt_tokens
    outcome.completion_tokens = usage.completion_tokens
    per_choice = usage.completion_tokens / max(1, n)
    if outcome.ttft is not None and outcome.e2e is not None and outcome.e2e > outcome.ttft and per_choice > 1:
        outcome.tpot = (outcome.e2e - outcome.ttft) / (per_choice - 1)
    elif outcome.e2e is not None and per_choice > 0 and outcome.e2e == outcome.ttft:
        outcome.tpot = outcome.e2e / per_choice
    return outcome
