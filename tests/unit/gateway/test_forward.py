"""Upstream over its socket transport against a real aiohttp server on 127.0.0.1: fall-through, timeouts,
stream failures (the same logic without sockets: test_attempts.py, test_relay.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import uvicorn
from aiohttp import web
from uvicorn.server import ServerState

from backends.models import Backend, Pool
from gateway.config.settings import ConnectionLimits, Timeouts
from gateway.http.asgi_io import DisconnectWatch, send_stream
from gateway.http.limits import protocol_class
from gateway.openai.errors import GatewayError
from gateway.request import relay, splice
from gateway.request.classify import Caller, classify
from gateway.request.context import RequestContext
from gateway.request.forward import OpenStream, RelayedStream, Upstream
from gateway.request.parse import ParsedRequest, parse
from gateway.request.sse import SseRelay
from gateway.upstream.client import KEEPALIVE_SECONDS, BackendClient
from gateway.upstream.connection import Connection
from policies.framework import Decision
from tests.support import free_port, serving

POOL = Pool(
    name="p", vendor="nvidia", accelerator="h100", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)
TIMEOUTS = Timeouts(connect=1.0, first_byte=0.2, between_chunks=0.15)

ANSWER = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}


def _event(content: str) -> bytes:
    data = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(data).encode() + b"\n\n"


USAGE_EVENT = (
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n'
)
DONE = b"data: [DONE]\n\n"
BIG_EVENTS = 400
SEEN = web.AppKey("seen", list)


async def _handler(request: web.Request) -> web.StreamResponse:
    """What the fake vLLM does is chosen by the request's `scenario` field (forwarded byte-for-byte)."""
    body = await request.json()
    request.app[SEEN].append((request.path, request.headers.copy(), body))
    scenario = body.get("scenario", "ok")
    if scenario == "ok":
        return web.json_response(ANSWER)
    if scenario == "slow":
        await asyncio.sleep(2)
        return web.json_response(ANSWER)
    if scenario == "503":
        return web.Response(status=503, text="Service Unavailable")
    if scenario == "400":
        return web.json_response(
            {"error": {"message": "context too long", "type": "BadRequestError", "param": None, "code": 400}},
            status=400,
        )
    if scenario == "not_sse":
        return web.json_response(ANSWER)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if scenario == "stream_slow_first":
        await asyncio.sleep(2)
    await response.write(_event("Hel"))
    if scenario == "stream_ok":
        await asyncio.sleep(0.01)
        await response.write(_event("lo") + USAGE_EVENT)
        await response.write(DONE)
    elif scenario == "stream_stall":
        await asyncio.sleep(0.05)
        await response.write(_event("lo"))
        await asyncio.sleep(2)
        await response.write(DONE)
    elif scenario == "stream_paced":
        for i in range(4):
            await asyncio.sleep(0.03)
            await response.write(_event(str(i)))
        await response.write(USAGE_EVENT + DONE)
    elif scenario == "stream_big":  # more than the client's socket holds: a slow client fills it
        for i in range(BIG_EVENTS):
            await response.write(_event(f"{i:04d}" + "x" * 1000))
            if i % 20 == 19:
                await asyncio.sleep(0.002)  # so the stream is still coming once the client has stopped
        await response.write(USAGE_EVENT)
        await response.write(DONE)
    elif scenario == "stream_drop":
        await asyncio.sleep(0.05)
        await response.write(_event("lo"))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.abort()
        return response
    await response.write_eof()
    return response


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, web.Application]]:
    app = web.Application()
    app[SEEN] = []
    app.router.add_post("/v1/chat/completions", _handler)
    async with serving(app, shutdown_timeout=0.1) as url:
        yield url, app


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    client = Upstream(BackendClient(8, KEEPALIVE_SECONDS), TIMEOUTS, max_connections_per_backend=8)
    await client.start()
    try:
        yield client
    finally:
        await client.close()


def _backend(name: str, url: str, api_key: str | None = None) -> Backend:
    return Backend(
        name=name, url=url, models=frozenset({"m"}), max_model_len=4096, pool=POOL, api_key=api_key
    )


def _closed() -> Backend:
    return _backend("closed", f"http://127.0.0.1:{free_port()}")


def _request(scenario: str, stream: bool = False) -> ParsedRequest:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "scenario": scenario,
        "stream": stream,
    }
    return parse("chat", json.dumps(body).encode())


def _ctx(
    upstream: Upstream,
    candidates: list[Backend],
    parsed: ParsedRequest,
    forwarded: dict[str, str] | None = None,
) -> RequestContext:
    """A request routed to `candidates`, as the pipeline hands it to the forward step."""
    caller = Caller(request_id="req-t", authorization=None, forwarded=forwarded or {})
    ctx = RequestContext(parsed.endpoint, caller, body=parsed.body)
    ctx.parsed = parsed
    ctx.profile = classify(parsed, caller)
    ctx.decision = Decision(candidates=candidates, route="r")
    ctx.limits = upstream.defaults
    return ctx


async def _complete(
    upstream: Upstream,
    candidates: list[Backend],
    parsed: ParsedRequest,
    forwarded: dict[str, str] | None = None,
) -> SimpleNamespace:
    ctx = _ctx(upstream, candidates, parsed, forwarded)
    answer = await upstream.complete(ctx)
    return SimpleNamespace(
        status=ctx.status,
        body=answer.body,
        content_type=answer.content_type,
        backend=ctx.backend,
        concurrency=ctx.concurrency,
        started_at=ctx.started_at,
        first_byte_at=ctx.first_byte_at,
    )


async def _open(
    upstream: Upstream, candidates: list[Backend], parsed: ParsedRequest
) -> tuple[RequestContext, OpenStream]:
    ctx = _ctx(upstream, candidates, parsed)
    return ctx, await upstream.open_stream(ctx)


async def _until(condition: Callable[[], bool], within: float = 2.0) -> None:
    deadline = asyncio.get_running_loop().time() + within
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


@dataclass
class _Abandoned:
    opened: OpenStream
    sse: SseRelay
    ends: list[RequestContext]
    stream: RelayedStream
    events: AsyncIterator[bytes]


async def _first_event_relayed(upstream: Upstream, url: str, scenario: str) -> _Abandoned:
    """A stream opened and its first event ("Hel") relayed to a client that reads no further."""
    ctx, opened = await _open(upstream, [_backend("b", url)], _request(scenario, stream=True))
    sse = SseRelay(keep_usage_chunk=False)
    ends: list[RequestContext] = []
    stream = upstream.relay(ctx, opened, sse, ends.append)
    events = aiter(stream)
    assert await anext(events) == _event("Hel")
    return _Abandoned(opened, sse, ends, stream, events)


async def _drain(
    upstream: Upstream, ctx: RequestContext, opened: OpenStream, sse: SseRelay, ends: list[RequestContext]
) -> bytes:
    return b"".join([chunk async for chunk in upstream.relay(ctx, opened, sse, ends.append)])


# --- non-streaming --------------------------------------------------------------------------------------


async def test_complete_ok_forwards_body_and_headers(server, upstream: Upstream):
    url, app = server
    backend = _backend("good", url, api_key="sk-upstream")
    parsed = _request("ok")
    answer = await _complete(upstream, [backend], parsed, {"x-request-id": "req-1"})
    assert answer.status == 200
    assert json.loads(answer.body) == ANSWER
    assert answer.backend is backend
    assert answer.concurrency == 1
    assert answer.content_type.startswith("application/json")
    assert answer.first_byte_at >= answer.started_at
    assert backend.inflight == 1  # the end of the request gives it back
    path, headers, body = app[SEEN][0]
    assert path == "/v1/chat/completions"
    assert headers["Authorization"] == "Bearer sk-upstream"
    assert headers["x-request-id"] == "req-1"
    assert body["scenario"] == "ok"


async def test_refused_candidate_falls_through_to_the_next(server, upstream: Upstream):
    url, app = server
    closed, good = _closed(), _backend("good", url)
    answer = await _complete(upstream, [closed, good], _request("ok"))
    assert answer.backend is good
    assert answer.status == 200
    assert closed.healthy is False
    assert closed.inflight == 0
    assert good.healthy is True
    assert good.inflight == 1
    assert len(app[SEEN]) == 1


async def test_all_candidates_refused_is_502(upstream: Upstream):
    first, second = _closed(), _backend("closed2", f"http://127.0.0.1:{free_port()}")
    with pytest.raises(GatewayError) as info:
        await _complete(upstream, [first, second], _request("ok"))
    assert info.value.status == 502
    assert info.value.body.code == "upstream_failed"
    assert "closed2" in info.value.body.message
    assert (first.inflight, second.inflight, first.healthy, second.healthy) == (0, 0, False, False)


async def test_first_byte_timeout_is_504_and_inflight_consistent(server, upstream: Upstream):
    url, _ = server
    slow = _backend("slow", url)
    with pytest.raises(GatewayError) as info:
        await _complete(upstream, [slow], _request("slow"))
    assert info.value.status == 504
    assert info.value.body.code == "upstream_timeout"
    assert "`slow`" in info.value.body.message
    assert "0.2 s" in info.value.body.message
    assert slow.inflight == 0
    assert slow.healthy is True  # slow is not refused


async def test_first_byte_timeout_names_the_backend_that_timed_out(server, upstream: Upstream):
    url, _ = server
    closed, slow = _closed(), _backend("slow", url)
    with pytest.raises(GatewayError) as info:
        await _complete(upstream, [closed, slow], _request("slow"))
    assert info.value.status == 504
    assert (closed.inflight, slow.inflight) == (0, 0)
    assert "`slow`" in info.value.body.message  # got "Backend `closed` did not send an answer ..."


async def test_complete_returns_upstream_error_status(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    answer = await _complete(upstream, [backend], _request("400"))
    assert answer.status == 400
    assert b"context too long" in answer.body


# --- streaming: opening ---------------------------------------------------------------------------------


async def test_stream_relays_and_finishes_once(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    parsed = _request("stream_ok", stream=True)
    ctx, opened = await _open(upstream, [backend], parsed)
    assert opened.backend is backend and backend.inflight == 1
    assert opened.first_chunk.startswith(b"data: ")
    sse = SseRelay(keep_usage_chunk=False)
    ends: list[RequestContext] = []
    out = await _drain(upstream, ctx, opened, sse, ends)
    assert out == _event("Hel") + _event("lo") + DONE
    assert sse.usage is not None and sse.usage.completion_tokens == 2
    assert sse.failed is None
    assert len(ends) == 1


async def test_stream_refused_first_candidate_falls_through(server, upstream: Upstream):
    url, _ = server
    closed, good = _closed(), _backend("good", url)
    ctx, opened = await _open(upstream, [closed, good], _request("stream_ok", stream=True))
    assert opened.backend is good
    assert (closed.healthy, closed.inflight, good.inflight) == (False, 0, 1)
    ends: list[RequestContext] = []
    await _drain(upstream, ctx, opened, SseRelay(keep_usage_chunk=True), ends)
    assert len(ends) == 1


async def test_stream_first_byte_timeout(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    with pytest.raises(GatewayError) as info:
        await _open(upstream, [backend], _request("stream_slow_first", stream=True))
    assert info.value.status == 504
    assert info.value.body.code == "upstream_timeout"
    assert "first chunk" in info.value.body.message
    assert backend.inflight == 0


async def test_stream_non_event_stream_content_type_is_502(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    with pytest.raises(GatewayError) as info:
        await _open(upstream, [backend], _request("not_sse", stream=True))
    assert info.value.status == 502
    assert info.value.body.code == "upstream_failed"
    assert "application/json" in info.value.body.message
    assert backend.inflight == 0


async def test_stream_503_is_502_naming_the_backend(server, upstream: Upstream):
    url, _ = server
    backend = _backend("gpu-7", url)
    with pytest.raises(GatewayError) as info:
        await _open(upstream, [backend], _request("503", stream=True))
    assert info.value.status == 502
    assert info.value.body.code == "upstream_failed"
    assert "`gpu-7`" in info.value.body.message
    assert "HTTP 503" in info.value.body.message
    assert backend.inflight == 0


async def test_stream_400_passes_through_with_its_message(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    with pytest.raises(GatewayError) as info:
        await _open(upstream, [backend], _request("400", stream=True))
    assert info.value.status == 400
    assert info.value.body.message == "context too long"
    assert info.value.body.type == "invalid_request_error"
    assert info.value.body.code == "backend_error"
    assert backend.inflight == 0


# --- streaming: failures after the first chunk ----------------------------------------------------------


def _last_event(out: bytes) -> dict:
    events = [e for e in out.split(b"\n\n") if e]
    return json.loads(events[-1].removeprefix(b"data: "))


async def test_stream_stall_ends_with_timeout_event(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    ctx, opened = await _open(upstream, [backend], _request("stream_stall", stream=True))
    sse = SseRelay(keep_usage_chunk=False)
    ends: list[RequestContext] = []
    out = await asyncio.wait_for(_drain(upstream, ctx, opened, sse, ends), timeout=3)
    assert out.startswith(_event("Hel") + _event("lo"))
    assert out.endswith(b"\n\n")
    error = _last_event(out)["error"]
    assert error["code"] == "upstream_timeout"
    assert "0.15 s" in error["message"]
    assert sse.failed is not None and sse.failed.status == 504
    assert len(ends) == 1
    assert DONE not in out


async def test_stream_connection_drop_ends_with_failed_event(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    ctx, opened = await _open(upstream, [backend], _request("stream_drop", stream=True))
    sse = SseRelay(keep_usage_chunk=False)
    ends: list[RequestContext] = []
    out = await asyncio.wait_for(_drain(upstream, ctx, opened, sse, ends), timeout=3)
    assert out.startswith(_event("Hel"))
    error = _last_event(out)["error"]
    assert error["code"] == "upstream_failed"
    assert "`b`" in error["message"]
    assert sse.failed is not None and sse.failed.status == 502
    assert len(ends) == 1


async def test_client_disconnect_mid_stream_finishes_once(server, upstream: Upstream):
    url, _ = server
    gone = await _first_event_relayed(upstream, url, "stream_stall")
    await gone.events.aclose()  # the HTTP layer stops iterating
    await _until(lambda: len(gone.ends) == 1)
    await gone.stream.aclose()  # ... and ends the stream again in its own `finally`
    gone.stream.end()
    await asyncio.sleep(0.05)
    assert len(gone.ends) == 1
    assert gone.opened.response.closed


async def test_a_client_gone_still_counts_the_events_the_backend_already_sent(server, upstream: Upstream):
    url, _ = server
    gone = await _first_event_relayed(upstream, url, "stream_stall")
    await asyncio.sleep(0.2)  # "lo" arrives while the client is not reading; then the client goes
    await gone.events.aclose()
    await _until(lambda: len(gone.ends) == 1)
    assert gone.sse.events == 2  # generated by the backend, so accounted, though never relayed
    assert gone.opened.response.closed


async def test_finish_runs_even_if_the_stream_is_never_iterated(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    ctx, opened = await _open(upstream, [backend], _request("stream_ok", stream=True))
    ends: list[RequestContext] = []
    sse = SseRelay(keep_usage_chunk=False)
    stream = upstream.relay(ctx, opened, sse, ends.append)
    await stream.aclose()  # the client went away before the response started
    await _until(lambda: len(ends) == 1)
    assert sse.events >= 1  # the first chunk, read to open the stream, was generated: counted
    assert opened.response.closed


async def test_slow_client_does_not_count_as_an_upstream_stall(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    ctx, opened = await _open(upstream, [backend], _request("stream_ok", stream=True))
    sse = SseRelay(keep_usage_chunk=True)
    ends: list[RequestContext] = []
    out = b""
    async for chunk in upstream.relay(ctx, opened, sse, ends.append):
        if not out:
            await asyncio.sleep(TIMEOUTS.between_chunks * 1.5)  # the client is slow to take the next chunk
        out += chunk
    assert out == _event("Hel") + _event("lo") + USAGE_EVENT + DONE
    assert sse.failed is None
    assert len(ends) == 1


# --- the same, pumped to a sink (as gateway/http/asgi_io.py does under uvicorn's protocol) ------------


class _Sink:
    """A `ChunkSink` that keeps what it is given; full (drain waits `full_for` s) after each write if set."""

    def __init__(self, full_for: float = 0.0) -> None:
        self.out = b""
        self.ended = False
        self.full_for = full_for
        self.drains = 0

    def write(self, data: bytes) -> bool:
        assert not self.ended
        self.out += data
        return self.full_for > 0

    async def drain(self) -> None:
        if self.full_for:
            self.drains += 1
            await asyncio.sleep(self.full_for)

    def end(self, data: bytes) -> None:
        self.out += data
        self.ended = True


async def _pumped(
    upstream: Upstream, url: str, scenario: str, sink: _Sink
) -> tuple[RelayedStream, SseRelay, list[RequestContext], OpenStream]:
    ctx, opened = await _open(upstream, [_backend("b", url)], _request(scenario, stream=True))
    sse = SseRelay(keep_usage_chunk=True)
    ends: list[RequestContext] = []
    stream = upstream.relay(ctx, opened, sse, ends.append)
    first = stream.start()
    assert first == _event("Hel") and not stream.last
    sink.out = first
    return stream, sse, ends, opened


async def test_a_pumped_stream_ends_with_its_last_piece_and_is_accounted(server, upstream: Upstream):
    url, _ = server
    sink = _Sink()
    stream, sse, ends, opened = await _pumped(upstream, url, "stream_ok", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.ended and sink.out == _event("Hel") + _event("lo") + USAGE_EVENT + DONE
    assert sse.failed is None and sse.usage is not None and sse.usage.completion_tokens == 2
    assert len(ends) == 1 and not opened.response.closed  # read to its end: pooled


async def test_a_pumped_stream_stall_ends_with_the_timeout_event(server, upstream: Upstream):
    url, _ = server
    sink = _Sink()
    stream, sse, ends, _ = await _pumped(upstream, url, "stream_stall", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.ended and sink.out.startswith(_event("Hel") + _event("lo"))
    assert _last_event(sink.out)["error"]["code"] == "upstream_timeout"
    assert sse.failed is not None and sse.failed.status == 504
    assert len(ends) == 1


async def test_a_pumped_stream_cut_ends_with_the_failed_event(server, upstream: Upstream):
    url, _ = server
    sink = _Sink()
    stream, sse, ends, _ = await _pumped(upstream, url, "stream_drop", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.ended and _last_event(sink.out)["error"]["code"] == "upstream_failed"
    assert sse.failed is not None and sse.failed.status == 502 and len(ends) == 1


async def test_a_full_client_is_not_an_upstream_stall_when_pumped(server, upstream: Upstream):
    url, _ = server
    sink = _Sink(full_for=TIMEOUTS.between_chunks * 1.5)  # every write fills the client's side a while
    stream, sse, ends, _ = await _pumped(upstream, url, "stream_ok", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.out == _event("Hel") + _event("lo") + USAGE_EVENT + DONE and sink.drains >= 1
    assert sse.failed is None and len(ends) == 1


async def test_a_client_gone_while_pumped_still_counts_what_the_backend_sent(server, upstream: Upstream):
    url, _ = server
    sink = _Sink()
    stream, sse, ends, opened = await _pumped(upstream, url, "stream_stall", sink)
    pumping = asyncio.create_task(stream.pump(sink))
    await asyncio.sleep(0.1)  # "lo" relayed, the backend then stalls
    pumping.cancel()  # the client left: the disconnect watch cancels the request's task
    with pytest.raises(asyncio.CancelledError):
        await pumping
    await _until(lambda: len(ends) == 1)
    assert sse.events == 2 and not sink.ended
    assert opened.response.closed


# --- the same, spliced: relayed in the backend connection's callbacks (a server that tells when its
# client's side fills and empties, as the gateway's own protocol does) -----------------------------------


class _SplicedSink(_Sink):
    """A `SpliceSink`. With `full_for`, each write fills the client's side and it empties `full_for` s
    later (as a slow client's transport pauses and resumes writing); `probe` runs just before it empties.
    `fail_on`: a write of a piece holding these bytes raises."""

    def __init__(
        self, full_for: float = 0.0, fail_on: bytes | None = None, probe: Callable[[], None] | None = None
    ) -> None:
        super().__init__(full_for)
        self.on_writable: Callable[[bool], None] | None = None
        self.paused = False
        self.watched = 0
        self.fail_on = fail_on
        self.probe = probe

    def watch_writable(self, on_writable: Callable[[bool], None]) -> bool:
        self.on_writable = on_writable
        self.watched += 1
        return True

    def unwatch_writable(self) -> None:
        self.on_writable = None

    def write(self, data: bytes) -> bool:
        assert not self.ended
        if self.fail_on is not None and self.fail_on in data:
            raise RuntimeError("the client's side broke")
        self.out += data
        if self.full_for and not self.paused:
            self.paused = True
            self.drains += 1
            asyncio.get_running_loop().call_later(self.full_for, self._emptied)
        return self.paused

    def _emptied(self) -> None:
        if self.probe is not None:
            self.probe()
        self.paused = False
        if self.on_writable is not None:
            self.on_writable(True)

    async def drain(self) -> None:
        assert not self.paused


async def _spliced(
    upstream: Upstream, url: str, scenario: str, sink: _SplicedSink
) -> tuple[RelayedStream, SseRelay, list[RequestContext], OpenStream]:
    stream, sse, ends, opened = await _pumped(upstream, url, scenario, sink)

    async def no_reads() -> bytes:
        raise AssertionError("a spliced stream is never read by its task")

    opened.response.readany = no_reads  # type: ignore[method-assign]
    return stream, sse, ends, opened


async def test_a_spliced_stream_ends_with_its_last_piece_and_is_accounted(server, upstream: Upstream):
    url, _ = server
    sink = _SplicedSink()
    stream, sse, ends, opened = await _spliced(upstream, url, "stream_ok", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.watched == 1 and sink.on_writable is None  # spliced, then let go
    assert sink.ended and sink.out == _event("Hel") + _event("lo") + USAGE_EVENT + DONE
    assert sse.failed is None and sse.usage is not None and sse.usage.completion_tokens == 2
    assert len(ends) == 1 and not opened.response.closed  # read to its end: pooled


async def test_a_spliced_stream_stall_ends_with_the_timeout_event(server, upstream: Upstream):
    url, _ = server
    backend = _backend("b", url)
    sink = _SplicedSink()
    ctx, opened = await _open(upstream, [backend], _request("stream_stall", stream=True))
    sse = SseRelay(keep_usage_chunk=True)
    ends: list[RequestContext] = []
    stream = upstream.relay(ctx, opened, sse, ends.append)
    sink.out = stream.start()
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert asyncio.get_running_loop().time() - started < 1  # the backend would have stalled 2 s
    assert sink.watched == 1 and sink.ended and sink.out.startswith(_event("Hel") + _event("lo"))
    assert _last_event(sink.out)["error"]["code"] == "upstream_timeout"
    assert sse.failed is not None and sse.failed.status == 504
    assert len(ends) == 1 and opened.response.closed
    assert backend.breaker.failures == 1  # told


async def test_a_spliced_stream_cut_ends_with_the_failed_event(server, upstream: Upstream):
    url, _ = server
    sink = _SplicedSink()
    stream, sse, ends, opened = await _spliced(upstream, url, "stream_drop", sink)
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.watched == 1 and sink.ended and _last_event(sink.out)["error"]["code"] == "upstream_failed"
    assert sse.failed is not None and sse.failed.status == 502 and len(ends) == 1
    assert opened.response.closed


async def test_a_full_client_pauses_the_backend_and_is_not_a_stall_when_spliced(server, upstream: Upstream):
    url, _ = server
    held: list[bool] = []
    sink = _SplicedSink(full_for=TIMEOUTS.between_chunks * 1.5, probe=lambda: held.append(conn._paused))
    stream, sse, ends, opened = await _spliced(upstream, url, "stream_paced", sink)
    conn = opened.response._conn  # type: ignore[attr-defined]
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    paced = b"".join([_event(str(i)) for i in range(4)])
    assert sink.out == _event("Hel") + paced + USAGE_EVENT + DONE and sink.drains >= 1
    assert held and all(held)  # the backend's socket was not read while the client's side was full
    assert sse.failed is None and len(ends) == 1 and not opened.response.closed


async def test_a_client_gone_while_spliced_still_counts_what_the_backend_sent(
    server, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
):
    url, _ = server
    monkeypatch.setattr(relay, "ABANDONED_DRAIN_S", 0.2)
    sink = _SplicedSink()
    stream, sse, ends, opened = await _spliced(upstream, url, "stream_stall", sink)
    pumping = asyncio.create_task(stream.pump(sink))
    await asyncio.sleep(0.1)  # "lo" relayed, the backend then stalls
    pumping.cancel()  # the client left: the disconnect watch cancels the request's task
    with pytest.raises(asyncio.CancelledError):
        await pumping
    assert sink.on_writable is None and opened.response._conn._sink is None  # type: ignore[attr-defined]
    await _until(lambda: len(ends) == 1)
    assert sse.events == 2 and not sink.ended
    assert opened.response.closed


async def test_a_spliced_stream_past_its_total_timeout_ends_with_the_timeout_event(
    server, upstream: Upstream
):
    url, _ = server
    sink = _SplicedSink()
    ctx = _ctx(upstream, [_backend("b", url)], _request("stream_paced", stream=True))
    ctx.limits = dataclasses.replace(upstream.defaults, total=0.08)  # the answer takes ~0.15 s
    opened = await upstream.open_stream(ctx)
    sse = SseRelay(keep_usage_chunk=True)
    ends: list[RequestContext] = []
    stream = upstream.relay(ctx, opened, sse, ends.append)
    sink.out = stream.start()
    await asyncio.wait_for(stream.pump(sink), timeout=3)
    assert sink.watched == 1 and sink.ended and _event("0") in sink.out and DONE not in sink.out
    assert _last_event(sink.out)["error"]["code"] == "upstream_timeout"
    assert sse.failed is not None and sse.failed.status == 504 and len(ends) == 1


async def test_a_failure_inside_the_spliced_relay_fails_the_stream_not_the_connection_loop(
    server, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
):
    url, _ = server
    monkeypatch.setattr(relay, "ABANDONED_DRAIN_S", 0.2)
    sink = _SplicedSink(fail_on=b'"content": "1"')
    stream, sse, ends, opened = await _spliced(upstream, url, "stream_paced", sink)
    with pytest.raises(RuntimeError, match="the client's side broke"):
        await asyncio.wait_for(stream.pump(sink), timeout=3)  # raised in the task, as pump raises it
    assert opened.response._conn._sink is None  # type: ignore[attr-defined]
    await _until(lambda: len(ends) == 1)
    assert sse.events >= 3  # what the backend had sent is counted all the same
    assert not sink.ended


# --- spliced end to end: the gateway's server protocol on a real socket, a real client ------------------


@dataclass
class _Served:
    sse: list[SseRelay]
    ends: list[RequestContext]
    spliced: list[bool]
    held: list[bool]
    port: int


@pytest.fixture
async def served(server, upstream: Upstream, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[_Served]:
    """The gateway's own server protocol relaying the stream the request's `scenario` names, its socket's
    send buffer small so that a client that does not read fills it soon."""
    url, _ = server
    got = _Served([], [], [], [], 0)
    start, hold = splice.Splice.start, Connection.hold

    def spy_start(self: splice.Splice) -> bool:
        got.spliced.append(start(self))
        return got.spliced[-1]

    def spy_hold(self: Connection, paused: bool) -> None:
        got.held.append(paused)
        hold(self, paused)

    monkeypatch.setattr(splice.Splice, "start", spy_start)
    monkeypatch.setattr(Connection, "hold", spy_hold)

    async def app(scope: Any, receive: Any, send: Any) -> None:
        body = (await receive())["body"]
        watch = DisconnectWatch(receive)
        send.__self__.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        ctx, opened = await _open(upstream, [_backend("b", url)], parse("chat", body))
        sse = SseRelay(keep_usage_chunk=False)
        got.sse.append(sse)
        stream = upstream.relay(ctx, opened, sse, got.ends.append)
        await send_stream(send, watch, {}, "text/event-stream", stream)

    cls = protocol_class(ConnectionLimits())
    config = uvicorn.Config(app, http=cls, ws="none", lifespan="off", access_log=False)
    state = ServerState()

    def connected() -> Any:
        protocol = cls(config, state, {})
        protocol.access_log = False  # on whenever its logger has handlers, as pytest's capture gives it
        return protocol

    listening = await asyncio.get_running_loop().create_server(connected, "127.0.0.1", 0)
    got.port = listening.sockets[0].getsockname()[1]
    try:
        yield got
    finally:
        listening.close()
        for protocol in list(state.connections):
            protocol.transport.close()


async def _ask(port: int, scenario: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    reader, writer = await asyncio.open_connection(sock=sock, limit=4096)  # reads past 8 KB wait for us
    body = _request(scenario, stream=True).body
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: g\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    await writer.drain()
    return reader, writer


async def test_a_slow_client_pauses_the_backend_and_gets_the_whole_stream_spliced(served: _Served):
    reader, writer = await _ask(served.port, "stream_big")
    head = await asyncio.wait_for(reader.readuntil(b'"Hel"'), timeout=3)
    await asyncio.sleep(TIMEOUTS.between_chunks * 3)  # then the client reads nothing a while
    assert served.spliced == [True] and True in served.held  # the backend's socket was paused
    assert served.ends == []  # the gateway waits for the client
    response = head
    while not response.endswith(b"\r\n0\r\n\r\n"):
        response += await asyncio.wait_for(reader.read(65536), timeout=5)
    writer.close()
    assert response.startswith(b"HTTP/1.1 200") and b"transfer-encoding: chunked" in response
    assert b"upstream_timeout" not in response  # waiting for the client is not a stall
    body = b"".join(response.split(b"\r\n\r\n", 1)[1].split(b"\r\n")[1::2])  # unchunked
    events = [_event(f"{i:04d}" + "x" * 1000) for i in range(BIG_EVENTS)]
    assert body == _event("Hel") + b"".join(events) + DONE  # the usage chunk dropped: not asked for
    await _until(lambda: len(served.ends) == 1)
    (sse,) = served.sse
    assert sse.failed is None and sse.usage is not None and sse.usage.completion_tokens == 2
    assert served.held[-1] is False  # reading again


async def test_a_client_gone_mid_splice_tells_the_backend_and_counts_what_it_sent(
    served: _Served, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(relay, "ABANDONED_DRAIN_S", 0.2)
    reader, writer = await _ask(served.port, "stream_stall")
    await asyncio.wait_for(reader.readuntil(b'"lo"'), timeout=3)
    writer.transport.abort()  # the client leaves while the backend stalls
    await _until(lambda: len(served.ends) == 1)
    assert served.spliced == [True]
    (sse,) = served.sse
    assert sse.events == 2 and sse.failed is None  # both events the backend sent: counted


# --- a stream whose client left: counting what the backend had sent ----------------------------------


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@pytest.fixture
async def raw_backend() -> AsyncIterator[tuple[str, dict[str, object]]]:
    """An SSE backend on a bare socket. `mode` "flush_on_eof": when the gateway's side of the connection
    ends it sends two more events (what vLLM had written before it took the disconnect) and closes;
    "ignore_eof": it keeps streaming an event every 20 ms until the connection is dropped."""
    state: dict[str, object] = {"mode": "flush_on_eof", "saw_eof": False, "dropped": False}

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        )
        writer.write(_chunk(_event("Hel")))
        if state["mode"] == "flush_on_eof":
            assert await reader.read() == b""
            state["saw_eof"] = True
            writer.write(_chunk(_event("lo")) + _chunk(_event("!")))
            await writer.drain()
            writer.close()
            return
        try:
            while True:
                await asyncio.sleep(0.02)
                writer.write(_chunk(_event("more")))
                await writer.drain()
        except ConnectionError:
            state["dropped"] = True

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", state
    finally:
        server.close()


async def test_a_client_gone_counts_what_the_backend_sends_until_it_takes_the_disconnect(
    raw_backend, upstream: Upstream
):
    url, state = raw_backend
    gone = await _first_event_relayed(upstream, url, "any")
    gone_at = time.monotonic()  # the request's stamps are on time.monotonic's clock
    await gone.events.aclose()
    await _until(lambda: len(gone.ends) == 1)
    assert state["saw_eof"]  # the backend was told, as a disconnect
    assert gone.sse.events == 3  # "lo" and "!" left the backend after the client had gone: counted
    assert (
        gone.ends[0].ended_at - gone_at < 0.05
    )  # the request ended when the client left, not when counting did
    assert gone.opened.response.closed


async def test_a_backend_that_ignores_the_disconnect_is_cut_off(
    raw_backend, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
):
    url, state = raw_backend
    state["mode"] = "ignore_eof"
    monkeypatch.setattr(relay, "ABANDONED_DRAIN_S", 0.2)
    gone = await _first_event_relayed(upstream, url, "any")
    await gone.events.aclose()
    await asyncio.sleep(0.1)
    assert gone.ends == []  # still counting
    await _until(lambda: len(gone.ends) == 1, within=1.0)
    assert 1 + 5 <= gone.sse.events <= 1 + 12  # about 0.2 s of events at 20 ms each
    await _until(lambda: state["dropped"] is True)
    assert gone.opened.response.closed


async def test_closing_the_upstream_waits_for_streams_still_counting(
    raw_backend, upstream: Upstream, monkeypatch: pytest.MonkeyPatch
):
    url, state = raw_backend
    state["mode"] = "ignore_eof"
    monkeypatch.setattr(relay, "ABANDONED_DRAIN_S", 0.2)
    gone = await _first_event_relayed(upstream, url, "any")
    await gone.events.aclose()
    await upstream.close()  # at shutdown: the count is finished (cut off at the drain limit), not lost
    assert len(gone.ends) == 1
