"""`/v1/files` and `/v1/batches` in OpenAI's shapes: what the official SDK's batch calls expect."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Annotated, Any

import msgspec
from litestar import Request, Response, get, post
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.handlers import BaseRouteHandler
from litestar.params import Body, FromPath, FromQuery

from gateway.batch.files import FileStoreError
from gateway.batch.finalize import split_lines
from gateway.batch.objects import (
    COMPLETION_WINDOW,
    ENDPOINTS,
    TERMINAL,
    WINDOW_S,
    BatchObject,
    FileObject,
    RequestCounts,
    StoredBatch,
    StoredFile,
    new_id,
    now,
    to_json,
)
from gateway.batch.service import BatchService
from gateway.batch.transitions import to_cancelling
from gateway.errors import GatewayError, invalid_request
from gateway.request.classify import key_id

_MAX_LIST = 100
log = logging.getLogger("switchyard.batch")


class CreateBatch(msgspec.Struct, forbid_unknown_fields=False):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None


def _not_found(what: str, ident: str) -> GatewayError:
    return GatewayError(404, f"No such {what}: '{ident}'.", "invalid_request_error", code="not_found")


@contextlib.contextmanager
def _store_usable() -> Iterator[None]:
    """A file store that fails is a 503 to the client; the log says which call failed and why."""
    try:
        yield
    except FileStoreError as exc:
        log.error("batch file store: %s", exc)
        raise GatewayError(
            503,
            "The batch file store cannot be used right now. Retry shortly.",
            "server_error",
            code="file_store_unavailable",
            headers={"retry-after": "5"},
        ) from None


def _json(obj: Any) -> Response[bytes]:
    return Response(to_json(obj), media_type="application/json")


def batch_handlers(service: BatchService) -> list[BaseRouteHandler]:
    state, files, options = service.state, service.files, service.options
    tenants = service.pipeline.tenants

    async def owner_of(request: Request[Any, Any, Any]) -> tuple[str, str | None]:
        authorization = request.headers.get("authorization")
        if service.keys_mode and tenants is not None:
            tenant = await tenants.authenticate(authorization)
            return tenant.key.id, None
        return key_id(authorization), authorization

    async def own_file(request: Request[Any, Any, Any], file_id: str) -> StoredFile:
        owner, _ = await owner_of(request)
        stored = await state.get_file(file_id)
        if stored is None or stored.owner != owner:
            raise _not_found("file", file_id)
        return stored

    async def batch_viewer(request: Request[Any, Any, Any]) -> str | None:
        """The key whose batches the caller sees; None for an admin key, which sees every key's."""
        if service.keys_mode and tenants is not None:
            tenant = await tenants.authenticate(request.headers.get("authorization"))
            return None if tenant.admin else tenant.key.id
        return key_id(request.headers.get("authorization"))

    async def own_batch(request: Request[Any, Any, Any], batch_id: str) -> StoredBatch:
        viewer = await batch_viewer(request)
        stored = await state.get(batch_id)
        if stored is None or (viewer is not None and stored.owner != viewer):
            raise _not_found("batch", batch_id)
        return stored

    async def live(stored: StoredBatch) -> BatchObject:
        """The batch as stored, with its line counts as of now while it runs."""
        batch = stored.batch
        if batch.status in ("in_progress", "finalizing", "cancelling"):
            completed, failed, _ = await state.progress(batch.id)
            counts = RequestCounts(total=batch.request_counts.total, completed=completed, failed=failed)
            batch = msgspec.structs.replace(batch, request_counts=counts)
        return batch

    @post(
        "/v1/files",
        name="files-create",
        status_code=200,
        request_max_body_size=options.max_file_bytes + 65536,
    )
    async def create_file(
        request: Request[Any, Any, Any],
        data: Annotated[dict[str, Any], Body(media_type=RequestEncodingType.MULTI_PART)],
    ) -> Response[bytes]:
        owner, _ = await owner_of(request)
        purpose = data.get("purpose")
        upload = data.get("file")
        if purpose != "batch":
            raise invalid_request(
                "`purpose` must be `batch` (the only purpose this gateway stores).", "purpose"
            )
        if not isinstance(upload, UploadFile):
            raise invalid_request("Send the file as the multipart field `file`.", param="file")
        content = await upload.read()
        if len(content) > options.max_file_bytes:
            raise invalid_request(f"The file is over {options.max_file_bytes} bytes.", param="file")
        lines = split_lines(content)
        if not lines:
            raise invalid_request("The file has no requests (one JSON object per line).", param="file")
        if len(lines) > options.max_lines:
            raise invalid_request(f"The file has over {options.max_lines} requests.", param="file")
        file_id = new_id("file").replace("file_", "file-")
        meta = FileObject(
            id=file_id,
            bytes=len(content),
            created_at=now(),
            filename=upload.filename or "input.jsonl",
            purpose="batch",
        )
        path = f"files/{file_id}"
        with _store_usable():
            await files.put(path, content)
        await state.put_file(StoredFile(file=meta, owner=owner, path=path))
        return _json(meta)

    @get("/v1/files/{file_id:str}", name="files-retrieve")
    async def retrieve_file(request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        return _json((await own_file(request, file_id)).file)

    @get("/v1/files/{file_id:str}/content", name="files-content")
    async def file_content(request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        stored = await own_file(request, file_id)
        with _store_usable():
            content = await files.get(stored.path)
        if content is None:
            raise _not_found("file", file_id)
        return Response(content, media_type="application/octet-stream")

    @post("/v1/batches", name="batches-create", status_code=200)
    async def create_batch(request: Request[Any, Any, Any]) -> Response[bytes]:
        owner, authorization = await owner_of(request)
        try:
            body = msgspec.json.decode(await request.body(), type=CreateBatch)
        except msgspec.ValidationError as exc:
            raise invalid_request(f"Invalid request body: {exc}") from None
        except msgspec.DecodeError:
            raise invalid_request("The body must be a JSON object.") from None
        if body.endpoint not in ENDPOINTS:
            raise invalid_request(f"`endpoint` must be one of {', '.join(ENDPOINTS)}.", param="endpoint")
        if body.completion_window != COMPLETION_WINDOW:
            raise invalid_request("`completion_window` must be `24h`.", param="completion_window")
        source = await state.get_file(body.input_file_id)
        if source is None or source.owner != owner:
            raise _not_found("file", body.input_file_id)
        if source.file.purpose != "batch":
            raise invalid_request("The input file's purpose must be `batch`.", param="input_file_id")
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
        window = options.window_s or WINDOW_S
        stored = StoredBatch(batch=batch, owner=owner, authorization=authorization, deadline=created + window)
        await state.create(stored)
        return _json(batch)

    @get("/v1/batches/{batch_id:str}", name="batches-retrieve")
    async def retrieve_batch(request: Request[Any, Any, Any], batch_id: FromPath[str]) -> Response[bytes]:
        return _json(await live(await own_batch(request, batch_id)))

    @get("/v1/batches", name="batches-list")
    async def list_batches(
        request: Request[Any, Any, Any], after: FromQuery[str | None] = None, limit: FromQuery[int] = 20
    ) -> Response[bytes]:
        viewer = await batch_viewer(request)
        if not 1 <= limit <= _MAX_LIST:
            raise invalid_request(f"`limit` must be between 1 and {_MAX_LIST}.", param="limit")
        found, more = await state.page(viewer, after, limit)
        data = [await live(stored) for stored in found]
        page = {
            "object": "list",
            "data": data,
            "first_id": data[0].id if data else None,
            "last_id": data[-1].id if data else None,
            "has_more": more,
        }
        return _json(page)

    @post("/v1/batches/{batch_id:str}/cancel", name="batches-cancel", status_code=200)
    async def cancel_batch(request: Request[Any, Any, Any], batch_id: FromPath[str]) -> Response[bytes]:
        stored = await own_batch(request, batch_id)
        if stored.batch.status in TERMINAL or stored.batch.status == "finalizing":
            raise GatewayError(
                409,
                f"Cannot cancel a batch with status `{stored.batch.status}`.",
                "invalid_request_error",
                code="batch_not_cancellable",
            )
        changed = await state.update(batch_id, to_cancelling())
        return _json(await live(changed or await own_batch(request, batch_id)))

    return [
        create_file,
        retrieve_file,
        file_content,
        create_batch,
        retrieve_batch,
        list_batches,
        cancel_batch,
    ]
