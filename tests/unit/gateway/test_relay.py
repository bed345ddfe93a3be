"""The stream relay and the end of a request, over an in-memory transport: what a stream is accounted as
when it completes, when its backend cuts it, and when it fails before its first byte."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from backends.catalog import Catalog
from backends.models import Backend, Pool
from gateway.config.settings import Retries, Timeouts
from gateway.http.asgi_io import DisconnectWatch, send_stream
from gateway.http.response_write import CycleSink, cycle_sink
from gateway.ledger.memory import InMemoryLedger
from gateway.ledger.records import UsageRecord
from gateway.openai.errors import GatewayError
from gateway.request.classify import Caller
from gateway.request.context import RequestContext
from gateway.request.forward import Upstream
from gateway.request.pipeline import Pipeline, Reply
from gateway.tenants.answers import pairs
from policies.framework import Decision
from policies.profile import RequestProfile
from tests.memory_transport import SSE, MemoryTransport, Scripted

POOL = Pool(
    name="p", vendor="nvidia", accelerator="h100", gpus_per_backend=1, price_per_gpu_hour=1.0, labels={}
)
TIMEOUTS = Timeouts(connect=1.0, first_byte=0.5, between_chunks=0.5)


def event(content: str) -> bytes:
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
             "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}]}  # fmt: skip
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


USAGE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
    b'"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}\n\n'
)
DONE = b"data: [DONE]\n\n"


class InOrder:
    """Routes to every backend serving the model, in configuration order."""

    name = "in-order"

    def choose(self, profile: RequestProfile, serving: Sequence[Backend]) -> Decision:
        return Decision(list(serving), "r/in-order")


class Seen:
    """What the observers hanging off the end of a request were told."""

    def __init__(self) -> None:
        self.records: list[UsageRecord] = []
        self.failures: list[tuple[str, int]] = []

    def recorded(self, record: UsageRecord, parsed: object) -> None:
        self.records.append(record)

    def failed(self, request_id: str, endpoint: str, status: int, *_: object) -> None:
        self.failures.append((request_id, status))

    def close(self) -> None:
        """Nothing buffered."""


def gateway(*answers: list[Scripted]) -> tuple[Pipeline, list[Backend], InMemoryLedger, Seen]:
    backends = [
        Backend(name=f"b{i}", url=f"mem://b{i}", models=frozenset({"m"}), max_model_len=4096, pool=POOL)
        for i in range(len(answers))
    ]
    transport = MemoryTransport({b.url: list(a) for b, a in zip(backends, answers, strict=True)})
    upstream = Upstream(transport, TIMEOUTS, 8, Retries(backoff_ms=0, backoff_max_ms=0))
    ledger = InMemoryLedger()
    seen = Seen()
    pipeline = Pipeline(Catalog(backends), InOrder(), upstream, ledger, telemetry=seen)
    return pipeline, backends, ledger, seen


async def serve(pipeline: Pipeline, stream: bool) -> tuple[RequestContext, Reply | GatewayError, bytes]:
    """One request as gateway/http/routes.py serves it: handle, end an error, relay a stream to its end."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "stream": stream}
    ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
    ctx.body = json.dumps(body).encode()
    try:
        reply = await pipeline.handle(ctx)
    except GatewayError as error:
        pipeline.end(ctx, error)
        return ctx, error, b""
    out = b"".join([c async for c in reply.stream]) if reply.stream is not None else reply.body
    return ctx, reply, out


async def test_a_completed_stream_is_accounted_once_with_the_backends_usage() -> None:
    answer = Scripted(headers=dict(SSE), chunks=[event("Hel"), event("lo"), USAGE, DONE])
    pipeline, (b0,), ledger, seen = gateway([answer])
    ctx, reply, out = await serve(pipeline, stream=True)
    assert out == event("Hel") + event("lo") + DONE  # the usage chunk is the gateway's (not asked for)
    assert isinstance(reply, Reply) and dict(reply.fixed)[b"x-switchyard-backend"] == b"b0"
    (record,) = seen.records
    assert (record.prompt_tokens, record.completion_tokens, record.usage_source) == (7, 2, "backend")
    assert (record.status, record.stream) == (200, True)
    assert ledger.recent(10) == [record]
    assert b0.inflight == 0 and ctx.ended


async def test_a_stream_cut_by_its_backend_ends_with_an_error_event_and_is_still_accounted() -> None:
    answer = Scripted(headers=dict(SSE), chunks=[event("Hel"), event("lo")], cut=True)
    pipeline, (b0,), _, seen = gateway([answer])
    _, _, out = await serve(pipeline, stream=True)
    events = [e for e in out.split(b"\n\n") if e]
    assert events[:2] == [event("Hel").strip(), event("lo").strip()]
    error = json.loads(events[-1].removeprefix(b"data: "))["error"]
    assert error["code"] == "upstream_failed" and "`b0`" in error["message"]
    assert b0.breaker.failures == 1
    await pipeline.settle_pending()  # no usage chunk: the prompt is counted by the backend, else estimated
    (record,) = seen.records
    assert (record.status, record.completion_tokens, record.usage_source) == (502, 1, "estimated")
    assert b0.inflight == 0


async def test_an_answer_is_accounted_and_its_cost_sent_back() -> None:
    body = b'{"usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}'
    pipeline, (b0,), _, seen = gateway([Scripted(chunks=[body])])
    _, reply, out = await serve(pipeline, stream=False)
    assert out == body
    (record,) = seen.records
    assert isinstance(reply, Reply)
    lines = dict(pairs(reply.lines))  # the gateway's own numbers and ids: the head's lines
    assert lines[b"x-switchyard-cost-usd"] == b"%.10f" % record.cost_usd
    assert lines[b"x-switchyard-request-id"] == lines[b"x-request-id"] == record.request_id.encode()
    assert "x-switchyard-attempts" not in reply.headers
    assert b0.inflight == 0


async def test_a_502_after_two_backends_ends_once_naming_both() -> None:
    failed = Scripted(status=503, chunks=[b'{"error": {"message": "overloaded"}}'])
    pipeline, backends, ledger, seen = gateway([failed], [failed])
    ctx, error, _ = await serve(pipeline, stream=False)
    assert isinstance(error, GatewayError) and error.status == 502
    assert error.headers["x-switchyard-attempts"] == "2"
    assert error.headers["x-switchyard-backends-tried"] == "b0,b1"
    assert seen.failures == [("req-1", 502)] and seen.records == []
    assert ledger.recent(10) == []
    assert [b.inflight for b in backends] == [0, 0]
    pipeline.end(ctx, error)  # a second end changes nothing
    assert seen.failures == [("req-1", 502)]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_retried_answer_says_how_many_backends_it_took(stream: bool) -> None:
    good = (
        Scripted(headers=dict(SSE), chunks=[event("x"), USAGE, DONE])
        if stream
        else Scripted(chunks=[b'{"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'])
    )
    pipeline, backends, _, seen = gateway([Scripted(status=503)], [good])
    _, reply, _ = await serve(pipeline, stream=stream)
    assert isinstance(reply, Reply) and reply.headers["x-switchyard-attempts"] == "2"
    assert dict(reply.fixed)[b"x-switchyard-backend"] == b"b1"
    assert len(seen.records) == 1 and [b.inflight for b in backends] == [0, 0]


class Sent:
    """An ASGI `send` that keeps the messages."""

    def __init__(self) -> None:
        self.messages: list[dict[str, object]] = []

    async def __call__(self, message: dict[str, object]) -> None:
        self.messages.append(message)


async def _sent_stream(chunks: list[bytes], cut: bool = False) -> tuple[list[dict[str, object]], Seen]:
    """A stream relayed by the HTTP layer (gateway/http/asgi_io.py `send_stream`): what it sent the client."""
    answer = Scripted(headers=dict(SSE), chunks=chunks, cut=cut)
    pipeline, _, _, seen = gateway([answer])
    ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
    ctx.body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    reply = await pipeline.handle(ctx)
    assert reply.stream is not None
    sent = Sent()

    async def never_disconnects() -> dict[str, object]:
        await asyncio.Event().wait()
        return {}

    watch = DisconnectWatch(never_disconnects)
    await send_stream(sent, watch, reply.headers, reply.content_type, reply.stream, reply.raw_headers)
    await pipeline.settle_pending()
    return sent.messages, seen


async def test_a_stream_read_to_its_end_is_ended_with_its_last_piece_not_one_more_write() -> None:
    messages, seen = await _sent_stream([event("Hel"), event("lo") + USAGE + DONE])
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert [(m["body"], m.get("more_body", False)) for m in bodies] == [
        (event("Hel"), True),
        (event("lo") + DONE, False),  # the last piece ends the response: no empty write after it
    ]
    (record,) = seen.records
    assert (record.completion_tokens, record.usage_source) == (2, "backend")


async def test_a_whole_stream_in_its_first_chunk_is_one_write_after_the_headers() -> None:
    messages, seen = await _sent_stream([event("Hel") + event("lo") + USAGE + DONE])
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[1]["body"] == event("Hel") + event("lo") + DONE
    assert not messages[1].get("more_body", False)
    assert seen.records[0].completion_tokens == 2


async def test_a_cut_stream_still_ends_with_its_error_event_then_the_end_of_the_response() -> None:
    messages, seen = await _sent_stream([event("Hel"), event("lo")], cut=True)
    bodies = [m for m in messages if m["type"] == "http.response.body"]
    assert b"upstream_failed" in bodies[-2]["body"]  # type: ignore[operator]
    assert bodies[-1] == {"type": "http.response.body", "body": b""}
    (record,) = seen.records
    assert (record.status, record.completion_tokens, record.usage_source) == (502, 1, "estimated")


class Wire:
    """A client transport that keeps what is written; `pause_after` writes, uvicorn's flow control is
    told the client's side is full (as the transport's high-water mark would)."""

    def __init__(self, pause_after: int | None = None) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.flow: FlowControl | None = None
        self._pause_after = pause_after

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        if self.flow is not None and len(self.writes) == self._pause_after:
            self.flow.pause_writing()

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def uvicorn_cycle(wire: Wire) -> RequestResponseCycle:
    scope: Any = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "http_version": "1.1"}
    flow = FlowControl(wire)  # type: ignore[arg-type]
    wire.flow = flow
    return RequestResponseCycle(
        scope=scope,
        transport=wire,  # type: ignore[arg-type]
        flow=flow,
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


async def _opened(chunks: list[bytes], cut: bool = False) -> tuple[Reply, Pipeline, Seen]:
    answer = Scripted(headers=dict(SSE), chunks=chunks, cut=cut)
    pipeline, _, _, seen = gateway([answer])
    ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
    ctx.body = json.dumps(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    ).encode()
    reply = await pipeline.handle(ctx)
    assert reply.stream is not None
    return reply, pipeline, seen


async def _never_disconnects() -> dict[str, object]:
    await asyncio.Event().wait()
    return {}


async def _pumped(chunks: list[bytes], cut: bool = False) -> tuple[Wire, RequestResponseCycle, Seen]:
    """The stream sent under uvicorn's own protocol: pumped to the transport once the head is out."""
    reply, pipeline, seen = await _opened(chunks, cut)
    wire = Wire()
    c = uvicorn_cycle(wire)
    assert reply.stream is not None
    await send_stream(
        c.send, DisconnectWatch(_never_disconnects), reply.headers, reply.content_type, reply.stream
    )
    await pipeline.settle_pending()
    return wire, c, seen


async def _as_uvicorn_sends_it(messages: list[dict[str, object]]) -> bytes:
    wire = Wire()
    c = uvicorn_cycle(wire)
    for message in messages:
        await c.send(message)  # type: ignore[arg-type]
    return b"".join(wire.writes)


@pytest.mark.parametrize(
    ("chunks", "cut"),
    [
        ([event("Hel"), event("lo"), event("!") + USAGE, DONE], False),  # ended by the end of the body
        ([event("Hel"), event("lo") + USAGE + DONE], False),  # ended by its last piece
        ([event("Hel"), event("lo")[:9], event("lo")[9:] + DONE], False),  # an event across two reads
        ([event("Hel"), event("lo")], True),  # cut: the error event
    ],
)
async def test_a_pumped_stream_writes_what_uvicorns_send_writes_one_write_a_read(
    chunks: list[bytes], cut: bool
) -> None:
    messages, iterated = await _sent_stream(chunks, cut)
    wire, c, pumped = await _pumped(chunks, cut)
    assert b"".join(wire.writes) == await _as_uvicorn_sends_it(messages)
    # the head with the first piece, then one write per read at most (a cut is one read more)
    assert len(wire.writes) <= len(chunks) + cut
    assert c.response_complete and c.message_event.is_set()
    assert [(r.status, r.completion_tokens, r.usage_source) for r in pumped.records] == [
        (r.status, r.completion_tokens, r.usage_source) for r in iterated.records
    ]


async def test_a_pumped_stream_reads_no_more_while_the_client_is_full() -> None:
    pieces = [event(str(i)) for i in range(6)] + [USAGE, DONE]
    reply, pipeline, seen = await _opened(pieces)
    wire = Wire(pause_after=2)  # the head and first piece, then one more piece fills the client's side
    c = uvicorn_cycle(wire)
    assert reply.stream is not None
    sending = asyncio.create_task(
        send_stream(
            c.send, DisconnectWatch(_never_disconnects), reply.headers, reply.content_type, reply.stream
        )
    )
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(wire.writes) == 2 and not sending.done()  # waiting for the client, not reading on
    assert c.flow is wire.flow
    wire.flow.resume_writing()
    await sending
    await pipeline.settle_pending()
    body = b"".join(wire.writes)
    assert all(event(str(i)) in body for i in range(6)) and body.endswith(DONE + b"\r\n0\r\n\r\n")
    (record,) = seen.records
    assert (record.completion_tokens, record.usage_source) == (2, "backend")


async def test_a_client_gone_mid_stream_is_written_nothing_more_and_the_stream_still_accounted() -> None:
    reply, pipeline, seen = await _opened([event("Hel"), event("lo"), USAGE, DONE])
    wire = Wire(pause_after=1)
    c = uvicorn_cycle(wire)
    assert reply.stream is not None
    sending = asyncio.create_task(
        send_stream(
            c.send, DisconnectWatch(_never_disconnects), reply.headers, reply.content_type, reply.stream
        )
    )
    for _ in range(20):
        await asyncio.sleep(0)
    assert wire.flow is not None
    c.disconnected = True  # as uvicorn's connection_lost does: the flow is let go, writes are dropped
    wire.flow.resume_writing()
    await sending
    await pipeline.settle_pending()
    assert len(wire.writes) == 1 and not c.response_complete
    (record,) = seen.records
    assert (record.completion_tokens, record.usage_source) == (2, "backend")


async def test_cycle_sink_is_only_for_a_chunked_response_uvicorn_started() -> None:
    wire = Wire()
    c = uvicorn_cycle(wire)
    assert cycle_sink(c.send, lambda: None) is None  # not started
    await c.send({"type": "http.response.start", "status": 200, "headers": []})
    assert isinstance(cycle_sink(c.send, lambda: None), CycleSink)
    assert cycle_sink(Sent(), lambda: None) is None  # another server's send
    fixed = uvicorn_cycle(Wire())
    await fixed.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    assert cycle_sink(fixed.send, lambda: None) is None
