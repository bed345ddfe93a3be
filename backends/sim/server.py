"""A vLLM-compatible OpenAI server whose "model" is a deterministic text generator with fixed pacing.

Streams follow vLLM's order. Chat: one role chunk per choice (`delta: {"role": "assistant",
"content": ""}`), then one chunk per generated token per choice (`delta: {"content": tok}`); the
chunk carrying a choice's last token also carries its `finish_reason` (for "stop" that token is
the empty end-of-sequence token, so the last chunk is `delta: {"content": ""}`). Then, only with
`stream_options.include_usage`, a chunk with `choices: []` and `usage`; then `data: [DONE]`.
Completions streams are the same without the role chunks and with `text` instead of `delta`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from typing import Any

import msgspec
from aiohttp import web

from backends.sim.embeddings import embeddings_answer
from backends.sim.engine import BatchEngine, Engine, FixedEngine, Run, SimClock
from backends.sim.faults import FaultState, FaultUpdate
from backends.sim.frames import StreamFrames
from backends.sim.messages_api import AnthropicError, MessagesShape, anthropic, messages_to_chat
from backends.sim.metrics import EngineStats
from backends.sim.options import SimOptions
from backends.sim.output import shape
from backends.sim.protocol import (
    GenerationRequest,
    Kind,
    SimError,
    UnparseableBody,
    full_response,
    parse_generation,
    stream_usage,
)
from backends.sim.responses_api import ResponsesShape, not_found_response, responses_to_chat
from backends.sim.spells import spell_seed
from backends.sim.text import Generation, generate

log = logging.getLogger("backends.sim")

VERSION = "sim-0.1"
_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_DONE = b"data: [DONE]\n\n"
_encode = msgspec.json.encode


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=_encode(data), status=status, content_type="application/json")


def _error(exc: SimError) -> web.Response:
    response = _json(exc.body(), exc.status)
    if exc.status == 429:
        response.headers["Retry-After"] = "1"
    return response


async def _read_json(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    try:
        # Checked here, not left to msgspec: which error it raises for invalid UTF-8 changed in 0.23.
        raw.decode()
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise SimError(400, f"Invalid JSON body: {exc}") from None
    except (UnicodeDecodeError, RecursionError):
        raise UnparseableBody() from None
    if not isinstance(body, dict):
        raise SimError(400, "The request body must be a JSON object")
    return body


class SimServer:
    """The request handlers; one instance per app, holding the options and the engine statistics."""

    def __init__(self, options: SimOptions) -> None:
        options.check()
        self.options = options
        self.clock = SimClock(options.time_scale)
        self.stats = EngineStats(model_name=options.models[0], kv_capacity_tokens=options.kv_capacity_tokens)
        self.engine: Engine
        if options.hardware is not None:
            spells = spell_seed(options.name, options.seed)
            self.engine = BatchEngine(options.hardware, self.stats, self.clock, spells)
        else:
            self.engine = FixedEngine(options.resolved_timing(), self.stats, self.clock)
        self.faults = FaultState(options.resolved_faults(), options.seed, self.clock.sleep)
        self.created = int(time.time())
        # Like vLLM's `vllm-<version>-<config hash>`: fixed per server; on full responses and last chunks.
        config = f"{options.models}/{options.max_model_len}/{options.seed}".encode()
        self.fingerprint = f"vllm-{VERSION}-{zlib.crc32(config):08x}"

    async def close(self, app: web.Application | None = None) -> None:
        await self.faults.close()
        await self.engine.close()

    async def get_faults(self, request: web.Request) -> web.Response:
        return _json(self.faults.snapshot())

    async def post_faults(self, request: web.Request) -> web.Response:
        try:
            update = msgspec.json.decode(await request.read(), type=FaultUpdate)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return _error(SimError(400, f"Invalid faults: {exc}"))
        await self.faults.update(update)
        return _json(self.faults.snapshot())

    async def info(self, request: web.Request) -> web.Response:
        """What this backend simulates: profile, KV geometry and clock (for tests and operators)."""
        hardware = self.options.hardware
        data: dict[str, Any] = {"name": self.options.name, "time_scale": self.options.time_scale}
        if hardware is None:
            data["timing"] = "fixed"
        else:
            data.update(
                timing="model",
                gpu=hardware.gpu.name,
                vendor=hardware.gpu.vendor,
                gpus=hardware.gpus,
                model_profile=hardware.model.name,
                kv_capacity_tokens=hardware.kv_capacity_tokens,
                num_blocks=hardware.num_blocks,
                block_size=hardware.limits.block_size,
                max_num_seqs=hardware.limits.max_num_seqs,
                max_num_batched_tokens=hardware.limits.max_num_batched_tokens,
            )
        return _json(data)

    async def _inject_faults(self) -> None:
        """Hang, fail or delay a request as the current faults say (raises SimError to fail it)."""
        faults = self.faults.faults
        if faults.hang:
            await asyncio.Event().wait()  # until the client goes away and aiohttp cancels the handler
        status = self.faults.draw_error()
        if status is not None:
            raise SimError(status, f"Simulated failure of backend {self.options.name}")
        if faults.added_latency_ms:
            await self.clock.sleep(faults.added_latency_ms / 1000.0)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def version(self, request: web.Request) -> web.Response:
        return _json({"version": VERSION})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.stats.render(), content_type="text/plain", charset="utf-8")

    async def models(self, request: web.Request) -> web.Response:
        return _json({"object": "list", "data": [self._model_card(m) for m in self.options.models]})

    def _model_card(self, model: str) -> dict[str, Any]:
        permission = {
            "id": f"modelperm-{os.urandom(16).hex()}",
            "object": "model_permission",
            "created": self.created,
            "allow_create_engine": False,
            "allow_sampling": True,
            "allow_logprobs": True,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }
        return {
            "id": model,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": model,
            "parent": None,
            "max_model_len": self.options.max_model_len,
            "permission": [permission],
        }

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "chat")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, "completion")

    async def _generation(self, request: web.Request, kind: Kind) -> web.StreamResponse:
        try:
            await self._inject_faults()
            received = time.monotonic()  # after any injected delay, which comes on top
            req, generations, run = self._start(kind, await _read_json(request), received)
        except SimError as exc:
            return _error(exc)
        prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
        request_id = f"{prefix}{os.urandom(16).hex()}"
        try:
            if req.stream:
                return await self._stream(request, req, request_id, generations, run)
            return await self._complete(request, req, request_id, generations, run)
        finally:
            run.close()

    def _start(
        self, kind: Kind, body: dict[str, Any], received: float | None = None
    ) -> tuple[GenerationRequest, list[Generation], Run]:
        """Parse a generation request, draw its choices and hand it to the engine (`received`: when its
        handler started, `time.monotonic()`)."""
        options = self.options
        req = parse_generation(kind, body, options.models, options.seed, options.max_model_len)
        generations = [
            shape(
                generate(
                    req.model,
                    prompt_key,
                    req.sampling_key,
                    0 if req.sampling_key is None else index,
                    req.max_tokens,
                    options.max_model_len - prompt_tokens,
                ),
                req.output,
                req.max_tokens,
            )
            for prompt_key, prompt_tokens in req.each_prompt()
            for index in range(req.n)
        ]
        return req, generations, self.engine.submit(req, generations, received)

    async def responses(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/responses: the Responses API over one chat generation."""
        try:
            await self._inject_faults()
            body = await _read_json(request)
            req, generations, run = self._start("chat", responses_to_chat(body))
        except SimError as exc:
            return _error(exc)
        answer = ResponsesShape(body, req.model, req.prompt_tokens)
        return await self._dialect(request, req, generations[0], run, answer)

    async def get_response(self, request: web.Request) -> web.Response:
        """Like vLLM by default, the simulator stores no response."""
        return _error(not_found_response(request.match_info["response_id"]))

    async def messages(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/messages: Anthropic's Messages API over one chat generation."""
        try:
            await self._inject_faults()
            body = await _read_json(request)
            req, generations, run = self._start("chat", messages_to_chat(body))
        except AnthropicError as exc:
            return _error(exc)
        except SimError as exc:
            return _error(anthropic(exc))
        answer = MessagesShape(req.model, req.prompt_tokens)
        return await self._dialect(request, req, generations[0], run, answer)

    async def _dialect(
        self,
        request: web.Request,
        req: GenerationRequest,
        generation: Generation,
        run: Run,
        answer: ResponsesShape | MessagesShape,
    ) -> web.StreamResponse:
        try:
            if not req.stream:
                await run.finish()
                return _json(answer.body(generation))
            response = web.StreamResponse(headers=_SSE_HEADERS)
            await response.prepare(request)
            await response.write(answer.opening(generation))
            sent = 0
            tokens = generation.tokens
            while sent < run.steps:
                produced = await run.advance(sent)
                await response.write(b"".join(answer.delta(generation, t) for t in tokens[sent:produced]))
                sent = produced
            await response.write(answer.closing(generation))
            await response.write_eof()
            return response
        except ConnectionResetError:
            log.debug("client went away during a %s stream", request.path)
            return web.Response(status=499)
        finally:
            run.close()

    def _die_after(self, run: Run) -> int | None:
        die = self.faults.faults.die_after_tokens
        return die if die is not None and die < run.steps else None

    async def _complete(
        self,
        request: web.Request,
        req: GenerationRequest,
        request_id: str,
        generations: list[Generation],
        run: Run,
    ) -> web.StreamResponse:
        die = self._die_after(run)
        if die is not None:
            produced = 0
            while produced < die:
                produced = await run.advance(produced)
            return _drop_connection(request)
        await run.finish()
        return _json(full_response(req, request_id, int(time.time()), generations, self.fingerprint))

    async def _stream(
        self,
        request: web.Request,
        req: GenerationRequest,
        request_id: str,
        generations: list[Generation],
        run: Run,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        created = int(time.time())
        choices = len(generations)
        frames = StreamFrames(req.kind, request_id, created, req.model, choices, self.fingerprint)
        plain, top = req.output.plain, req.output.logprobs
        # Without the usage chunk, the stream's last token chunk carries system_fingerprint.
        last_step = run.steps - 1 if not req.include_usage else -1
        last_index = max((i for i, g in enumerate(generations) if len(g.tokens) == run.steps), default=0)
        die = self._die_after(run)
        try:
            sent = 0
            while sent < run.steps:
                if die is not None and sent >= die:
                    _drop_connection(request)
                    return response
                produced = await run.advance(sent)
                if die is not None:
                    produced = min(produced, die)
                parts: list[bytes] = []
                for step in range(sent, produced):
                    if step == 0 and req.kind == "chat":
                        parts += (frames.role(i) for i in range(choices))
                    for index, generation in enumerate(generations):
                        tokens = generation.tokens
                        if step < len(tokens):
                            if not plain:
                                last = step == last_step and index == last_index
                                parts.append(frames.shaped(index, generation, step, top, last))
                            elif step == len(tokens) - 1:
                                last = step == last_step and index == last_index
                                parts.append(
                                    frames.token(index, tokens[step], generation.finish_reason, last)
                                )
                            else:
                                parts.append(frames.token(index, tokens[step], None))
                await response.write(b"".join(parts))
                sent = produced
            tail = [_DONE]
            if req.include_usage:
                completion_tokens = sum(len(g.tokens) for g in generations)
                usage = stream_usage(req.prompt_tokens, completion_tokens)
                tail.insert(0, frames.usage(request_id, created, req.model, usage))
            await response.write(b"".join(tail))
            await response.write_eof()
        except ConnectionResetError:
            log.debug("client went away during %s", request_id)
        return response

    async def embeddings(self, request: web.Request) -> web.Response:
        try:
            await self._inject_faults()
            answer = embeddings_answer(await _read_json(request), self.options.models)
        except SimError as exc:
            return _error(exc)
        self.stats.prompt_tokens += answer["usage"]["prompt_tokens"]
        return _json(answer)


def _drop_connection(request: web.Request) -> web.Response:
    """Close the client's connection abruptly, without ending the response (the `die_after_tokens` fault).

    Returns a response for the handler to return, which aiohttp cannot send on the closed transport.
    """
    transport = request.transport
    if transport is not None:
        transport.abort()
    return web.Response(status=500)
