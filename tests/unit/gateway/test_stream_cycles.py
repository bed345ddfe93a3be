"""A streamed request leaves no reference cycle behind: its objects are freed as it ends, not by the garbage
collector's passes, which held the event loop 8 ms each under streamed load (docs/benchmarks.md)."""

from __future__ import annotations

import gc
import json

from gateway.request.classify import Caller
from gateway.request.context import RequestContext
from gateway.request.sse import SseRelay
from tests.memory_transport import SSE, Scripted
from tests.unit.gateway.test_relay import DONE, USAGE, event, gateway


async def test_a_streamed_request_is_freed_without_the_garbage_collector() -> None:
    answer = Scripted(headers=dict(SSE), chunks=[event("Hel"), event("lo"), USAGE, DONE])
    pipeline, _, _, seen = gateway([answer])
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    gc.collect()
    gc.disable()
    try:
        ctx = RequestContext("chat", Caller(request_id="req-1", authorization=None, forwarded={}))
        ctx.body = json.dumps(body).encode()
        reply = await pipeline.handle(ctx)
        assert reply.stream is not None and ctx.sse is not None and ctx.sse.cost_of is not None
        out = b"".join([c async for c in reply.stream])
        assert b'"switchyard_cost_usd"' in out and len(seen.records) == 1
        del ctx, reply
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        left = [type(o).__name__ for o in gc.garbage if isinstance(o, (RequestContext, SseRelay, Caller))]
        assert left == []
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
