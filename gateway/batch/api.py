"""`/v1/batches` in OpenAI's shapes: what the official SDK's batch calls expect (files: files_api.py)."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgspec
from litestar import Controller, Request, Response, get, post
from litestar.params import FromPath, FromQuery

from gateway.batch.caller import caller_of
from gateway.batch.objects import (
    COMPLETION_WINDOW,
    ENDPOINTS,
    TERMINAL,
    WINDOW_S,
    BatchObject,
    RequestCounts,
    StoredBatch,
    list_page,
    new_id,
    to_json,
)
from gateway.batch.quota import over_quota, quota_for
from gateway.batch.service import BatchService
from gateway.batch.transitions import to_cancelling
from gateway.http.controllers import per_app
from gateway.openai.errors import GatewayError, invalid_request

_MAX_LIST = 100
log = logging.getLogger("switchyard.batch")


class CreateBatch(msgspec.Struct, forbid_unknown_fields=False):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


def _not_found(what: str, ident: str) -> GatewayError:
    return GatewayError(404, f"No such {what}: '{ident}'.", "invalid_request_error", code="not_found")


def _json(obj: Any) -> Response[bytes]:
    return Response(to_json(obj), media_type="application/json")


class BatchesController(Controller):
    """`/v1/batches` over the app's batch service (its state, options and callers)."""

    path = "/v1/batches"
    service: BatchService

    async def batch_viewer(self, request: Request[Any, Any, Any]) -> str | None:
        """The key whose batches the caller sees; None for an admin key, which sees every key's."""
        caller = await caller_of(self.service, request)
        return None if caller.admin else caller.owner

    async def own_batch(self, request: Request[Any, Any, Any], batch_id: str) -> StoredBatch:
        viewer = await self.batch_viewer(request)
        stored = await self.service.state.get(batch_id)
        if stored is None or (viewer is not None and stored.owner != viewer):
            raise _not_found("batch", batch_id)
        return stored

    async def live(self, stored: StoredBatch) -> BatchObject:
        """The batch as stored, with its line counts as of now while it runs."""
        batch = stored.batch
        if batch.status in ("in_progress", "finalizing", "cancelling"):
            completed, failed, _ = await self.service.state.progress(batch.id)
            counts = RequestCounts(total=batch.request_counts.total, completed=completed, failed=failed)
            batch = msgspec.structs.replace(batch, request_counts=counts)
        return batch

    @post("/", name="batches-create", status_code=200)
    async def create_batch(self, request: Request[Any, Any, Any]) -> Response[bytes]:
        caller = await caller_of(self.service, request)
        owner, authorization = caller.owner, caller.authorization
        try:
            body = msgspec.json.decode(await request.body(), type=CreateBatch)
        except msgspec.ValidationError as exc:
            raise invalid_request(f"Invalid request body: {exc}", code="invalid_value") from None
        except msgspec.DecodeError:
            raise invalid_request("The body must be a JSON object.", code="invalid_json") from None
        if body.endpoint not in ENDPOINTS:
            raise invalid_request(
                f"`endpoint` must be one of {', '.join(ENDPOINTS)}.", param="endpoint", code="invalid_value"
            )
        if body.completion_window != COMPLETION_WINDOW:
            raise invalid_request(
                "`completion_window` must be `24h`.", param="completion_window", code="invalid_value"
            )
        source = await self.service.state.get_file(body.input_file_id)
        if source is None or source.owner != owner:
            raise _not_found("file", body.input_file_id)
        if source.file.purpose != "batch":
            raise invalid_request(
                "The input file's purpose must be `batch`.", param="input_file_id", code="invalid_value"
            )
        created = time.time()
        batch = BatchObject(
            id=new_id("batch"),
            endpoint=body.endpoint,
            input_file_id=body.input_file_id,
            completion_window=COMPLETION_WINDOW,
            status="validating",
            created_at=int(created),
            expires_at=int(created + WINDOW_S),
            metadata=body.metadata,
        )
        window = self.service.options.window_s or WINDOW_S
        stored = StoredBatch(batch=batch, owner=owner, authorization=authorization, deadline=created + window)
        quota = quota_for(self.service.options, caller.key)
        refusal = await self.service.state.create(stored, quota.max_open_batches)
        if refusal == "no_file":  # deleted since it was read
            raise _not_found("file", body.input_file_id)
        if refusal is not None:
            raise over_quota(refusal, quota)
        return _json(batch)

    @get("/{batch_id:str}", name="batches-retrieve")
    async def retrieve_batch(
        self, request: Request[Any, Any, Any], batch_id: FromPath[str]
    ) -> Response[bytes]:
        return _json(await self.live(await self.own_batch(request, batch_id)))

    @get("/", name="batches-list")
    async def list_batches(
        self, request: Request[Any, Any, Any], after: FromQuery[str | None] = None, limit: FromQuery[int] = 20
    ) -> Response[bytes]:
        viewer = await self.batch_viewer(request)
        if not 1 <= limit <= _MAX_LIST:
            raise invalid_request(
                f"`limit` must be between 1 and {_MAX_LIST}.", param="limit", code="invalid_value"
            )
        found, more = await self.service.state.page(viewer, after, limit)
        data = [await self.live(stored) for stored in found]
        return _json(list_page(data, more))

    @post("/{batch_id:str}/cancel", name="batches-cancel", status_code=200)
    async def cancel_batch(self, request: Request[Any, Any, Any], batch_id: FromPath[str]) -> Response[bytes]:
        stored = await self.own_batch(request, batch_id)
        if stored.batch.status in TERMINAL or stored.batch.status == "finalizing":
            raise GatewayError(
                409,
                f"Cannot cancel a batch with status `{stored.batch.status}`.",
                "invalid_request_error",
                code="batch_not_cancellable",
            )
        changed = await self.service.state.update(batch_id, to_cancelling())
        return _json(await self.live(changed or await self.own_batch(request, batch_id)))


def batches_controller(service: BatchService) -> type[BatchesController]:
    return per_app(BatchesController, service=service)
