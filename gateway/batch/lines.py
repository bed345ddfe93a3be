"""One line of a batch's input: checked, sent through the pipeline as class `batch`, turned into a result.

A line goes through the pipeline's steps like any request (the tenants seam with the batch's key, the
policy's class and route, the ledger), marked with `x-switchyard-class: batch` and priority `batch`, but
to the backend the scheduler chose for it (gateway/batch/capacity.py) rather than the route's first
choice: batch work goes where there is idle room, whatever pool the online routes prefer. A line too long
for that backend goes where the route sends it. A failed send is retried by the scheduler, later.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import msgspec

from backends.models import Backend
from gateway.batch.objects import ENDPOINTS
from gateway.openai.errors import GatewayError
from gateway.request.classify import Caller
from gateway.request.context import RequestContext
from gateway.request.parse import Endpoint
from gateway.request.pipeline import Pipeline, Reply
from gateway.tenants.admission import Tenant, Tenants
from policies.framework import Decision

_decoder = msgspec.json.Decoder()
_encode = msgspec.json.Encoder().encode
RETRYABLE = frozenset({429, 500, 502, 503, 504})
NOT_RETRIED_CODES = frozenset({"insufficient_quota", "model_not_allowed"})


@dataclass(slots=True)
class LineResult:
    text: bytes
    """The output or error file's line (JSON, no newline)."""
    failed: bool
    retry: bool = False
    """A backend failure another attempt may fix."""
    usage: tuple[int, int] | None = None
    """Prompt and completion tokens of a line that was answered."""


class Malformed(ValueError):
    pass


def parse_line(raw: bytes, endpoint: str) -> tuple[str, Endpoint, dict[str, Any]]:
    """custom_id, gateway endpoint and body of a line; `Malformed` says what is wrong with it."""
    try:
        line = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise Malformed(f"Line is not valid JSON: {exc}") from None
    if not isinstance(line, dict):
        raise Malformed("Line must be a JSON object with custom_id, method, url and body.")
    custom_id = line.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise Malformed("Line has no `custom_id` string.")
    if line.get("method") != "POST":
        raise Malformed("`method` must be `POST`.")
    url = line.get("url")
    if url != endpoint:
        raise Malformed(f"`url` must be the batch's endpoint `{endpoint}`, got {url!r}.")
    body = line.get("body")
    if not isinstance(body, dict):
        raise Malformed("`body` must be a JSON object.")
    if body.get("stream"):
        raise Malformed("`stream` is not supported in a batch.")
    if endpoint == "/v1/responses":
        # Batch lines are neither stored nor continued (each is answered on its own, as OpenAI's are).
        if body.get("previous_response_id") is not None:
            raise Malformed("`previous_response_id` is not supported in a batch.")
        body["store"] = False
    return custom_id, ENDPOINTS[endpoint], body


def custom_id_of(raw: bytes) -> str | None:
    try:
        line = _decoder.decode(raw)
    except msgspec.DecodeError:
        return None
    value = line.get("custom_id") if isinstance(line, dict) else None
    return value if isinstance(value, str) else None


def result_line(custom_id: str | None, status: int | None, body: Any, error: dict[str, Any] | None) -> bytes:
    response = None if status is None else {"status_code": status, "request_id": "", "body": body}
    return _encode(
        {
            "id": f"batch_req_{os.urandom(12).hex()}",
            "custom_id": custom_id,
            "response": response,
            "error": error,
        }
    )


def error_line(custom_id: str | None, code: str, message: str) -> LineResult:
    return LineResult(result_line(custom_id, None, None, {"code": code, "message": message}), failed=True)


async def send_to(
    pipeline: Pipeline, tenants: Tenants | None, ctx: RequestContext, backend: Backend | None
) -> Reply:
    """`Pipeline.handle` for a non-streaming line, sent to `backend` when it can take the line; `tenants`
    are the pipeline's (None in open mode)."""
    pipeline.parse(ctx)
    pipeline.classify(ctx)
    key = ctx.caller.key
    if key is not None:
        assert tenants is not None  # a key is set only when the tenants seam is on
        tenants.check(key, ctx.profile)
    pipeline.route(ctx)
    routed = ctx.decision
    if backend is not None and backend.max_model_len >= ctx.profile.context_needed:
        ctx.decision = Decision([backend], routed.route, routed.request_class)
    if key is not None:
        assert tenants is not None
        ignored = ctx.caller.hints_ignored or []
        ctx.caller.admission = await tenants.admit(key, ctx.profile, ctx.decision.candidates, ignored)
    return await pipeline.complete(ctx)


async def run_line(
    pipeline: Pipeline,
    tenants: Tenants | None,
    raw: bytes,
    endpoint: str,
    request_id: str,
    tenant: Tenant | None,
    auth: str | None,
    backend: Backend | None = None,
    contexts: dict[object, RequestContext] | None = None,
) -> LineResult:
    """`contexts` (when given) holds the line's request under `request_id` while it runs, so the
    scheduler tells the backends' batch lines from their online requests."""
    try:
        custom_id, gateway_endpoint, body = parse_line(raw, endpoint)
    except Malformed as exc:
        return error_line(custom_id_of(raw), "invalid_request", str(exc))
    caller = Caller(
        request_id=request_id,
        authorization=auth,
        forwarded={"x-request-id": request_id},
        priority="batch",
        explicit_class="batch",
        key=tenant,
    )
    ctx = RequestContext(gateway_endpoint, caller)
    ctx.body = _encode(body)
    if contexts is not None:
        contexts[request_id] = ctx
    try:
        reply = await send_to(pipeline, tenants, ctx, backend)
    except GatewayError as exc:
        pipeline.end(ctx, exc)  # the request path ends a request that raised where it is served from
        status, code = exc.status, exc.body.code
        retry = status in RETRYABLE and code not in NOT_RETRIED_CODES
        error_body = _decoder.decode(exc.to_json())
        text = result_line(custom_id, status, error_body, None)
        return LineResult(_with_request_id(text, request_id), failed=True, retry=retry)
    except BaseException as exc:
        pipeline.end(ctx, exc)
        raise
    answer = _decoder.decode(reply.body)
    text = result_line(custom_id, 200, answer, None)
    return LineResult(_with_request_id(text, request_id), failed=False, usage=_usage_of(answer))


def _usage_of(answer: Any) -> tuple[int, int] | None:
    usage = answer.get("usage") if isinstance(answer, dict) else None
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens", 0)
    if prompt is None:  # a Responses API answer
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens", 0)
    if not isinstance(prompt, int) or not isinstance(completion, int):
        return None
    return prompt, completion


def _with_request_id(text: bytes, request_id: str) -> bytes:
    return text.replace(b'"request_id":""', b'"request_id":' + _encode(request_id), 1)
