"""`/v1/files` in OpenAI's shapes: upload, list, retrieve, content and delete, within the key's quota.

A key sees and deletes only its own files (another's answers 404, as if it did not exist); the admin key
lists every file and may delete any. An upload is recorded (and counted against the key's quota, atomically)
before its body is written, and forgotten again if the write fails, so a refused upload leaves nothing.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from typing import Annotated, Any

from litestar import Controller, Request, Response, delete, get, post
from litestar.connection import ASGIConnection
from litestar.datastructures import UploadFile
from litestar.enums import RequestEncodingType
from litestar.handlers import BaseRouteHandler
from litestar.params import Body, FromPath, FromQuery
from litestar.types import Guard

from gateway.batch.caller import Caller, caller_of
from gateway.batch.files import FileStoreError
from gateway.batch.finalize import split_lines
from gateway.batch.objects import FileObject, StoredFile, list_page, new_id, now, to_json
from gateway.batch.quota import file_in_use, file_too_large, over_quota, quota_for
from gateway.batch.service import BatchService
from gateway.batch.state import UnknownCursor
from gateway.http.controllers import per_app
from gateway.openai.errors import GatewayError, invalid_request

MAX_LIST = 10_000
"""OpenAI's largest (and default) `limit` for `GET /v1/files`."""
_MULTIPART_SLACK = 65536
_PURPOSE = re.compile(r"^[a-z][a-z_-]{0,31}$")
_FILE_ID = re.compile(r"^file-[A-Za-z0-9_-]{1,100}$")
UPLOAD = "files-create"
log = logging.getLogger("switchyard.batch")


def _not_found(file_id: str) -> GatewayError:
    return GatewayError(404, f"No such file: '{file_id}'.", "invalid_request_error", code="not_found")


def _invalid(message: str, param: str) -> GatewayError:
    return invalid_request(message, param=param, code="invalid_value")


@contextlib.contextmanager
def store_usable() -> Iterator[None]:
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


def _whole(text: str) -> int | None:
    """`text` as a whole number, if it is one of at most 18 ASCII digits."""
    return int(text) if len(text) <= 18 and text.isascii() and text.isdigit() else None


def _limit(text: str | None) -> int:
    if text is None:
        return MAX_LIST
    limit = _whole(text)
    if limit is None or not 1 <= limit <= MAX_LIST:
        raise _invalid(f"`limit` must be a whole number from 1 to {MAX_LIST}.", "limit")
    return limit


def upload_allowed(service: BatchService) -> Guard:
    """Before an upload's body is read: a key (keys mode), and a declared length within its upload limit.
    The other file routes read no body; they pass."""

    async def guard(connection: ASGIConnection[Any, Any, Any, Any], handler: BaseRouteHandler) -> None:
        if handler.name != UPLOAD:
            return
        limit = quota_for(service.options, (await caller_of(service, connection)).key).max_file_bytes
        declared = connection.headers.get("content-length", "")
        if len(declared) > 18 or (_whole(declared) or 0) > limit + _MULTIPART_SLACK:
            raise file_too_large(limit)

    return guard


class FilesController(Controller):
    """`/v1/files` over the app's batch service: a key sees its own files, the admin key every file. Its
    guard and body limit, set per app by `files_controller`, are the upload's (the one route with a body)."""

    path = "/v1/files"
    service: BatchService

    async def visible_file(self, caller: Caller, file_id: str) -> StoredFile:
        stored = await self.service.state.get_file(file_id)
        if stored is None or not (caller.admin or stored.owner == caller.owner):
            raise _not_found(file_id)
        return stored

    @post("/", name=UPLOAD, status_code=200)
    async def create_file(
        self,
        request: Request[Any, Any, Any],
        data: Annotated[dict[str, Any], Body(media_type=RequestEncodingType.MULTI_PART)],
    ) -> Response[bytes]:
        service = self.service
        options, state = service.options, service.state
        caller = await caller_of(service, request)
        quota = quota_for(options, caller.key)
        purpose = data.get("purpose")
        upload = data.get("file")
        if purpose != "batch":
            raise _invalid("`purpose` must be `batch` (the only purpose this gateway stores).", "purpose")
        if not isinstance(upload, UploadFile):
            raise invalid_request(
                "Send the file as the multipart field `file`.", param="file", code="missing_required"
            )
        content = await upload.read()
        if len(content) > quota.max_file_bytes:
            raise file_too_large(quota.max_file_bytes)
        lines = split_lines(content)
        if not lines:
            raise invalid_request(
                "The file has no requests (one JSON object per line).", param="file", code="empty_file"
            )
        if len(lines) > options.max_lines:
            raise invalid_request(
                f"The file has over {options.max_lines} requests.", param="file", code="too_many_requests"
            )
        file_id = new_id("file").replace("file_", "file-")
        meta = FileObject(
            id=file_id,
            bytes=len(content),
            created_at=now(),
            filename=upload.filename or "input.jsonl",
            purpose="batch",
        )
        stored = StoredFile(file=meta, owner=caller.owner, path=f"files/{file_id}")
        refusal = await state.add_file(stored, quota)
        if refusal is not None:
            raise over_quota(refusal, quota)
        try:
            with store_usable():
                await service.files.put(stored.path, content)
        except BaseException:
            await state.remove_file(file_id)
            raise
        return _json(meta)

    @get("/", name="files-list")
    async def list_files(
        self,
        request: Request[Any, Any, Any],
        limit: FromQuery[str | None] = None,
        after: FromQuery[str | None] = None,
        order: FromQuery[str | None] = None,
        purpose: FromQuery[str | None] = None,
    ) -> Response[bytes]:
        caller = await caller_of(self.service, request)
        for name in ("limit", "after", "order", "purpose"):
            if len(request.query_params.getall(name, [])) > 1:
                raise _invalid(f"`{name}` is given more than once.", name)
        count = _limit(limit)
        if order not in (None, "asc", "desc"):
            raise _invalid("`order` must be `asc` or `desc`.", "order")
        if after is not None and not _FILE_ID.match(after):
            raise _invalid("`after` must be a file id (`file-...`).", "after")
        if purpose is not None and not _PURPOSE.match(purpose):
            raise _invalid("`purpose` must be a purpose such as `batch` or `batch_output`.", "purpose")
        owner = None if caller.admin else caller.owner
        try:
            found, more = await self.service.state.list_files(
                owner, after, count, "asc" if order == "asc" else "desc", purpose
            )
        except UnknownCursor:
            raise _invalid(f"`after`: no file '{after}' in this list.", "after") from None
        data = [stored.file for stored in found]
        return _json(list_page(data, more))

    @get("/{file_id:str}", name="files-retrieve")
    async def retrieve_file(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        return _json((await self.visible_file(await caller_of(self.service, request), file_id)).file)

    @get("/{file_id:str}/content", name="files-content")
    async def file_content(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        stored = await self.visible_file(await caller_of(self.service, request), file_id)
        with store_usable():
            content = await self.service.files.get(stored.path)
        if content is None:
            raise _not_found(file_id)
        return Response(content, media_type="application/octet-stream")

    @delete("/{file_id:str}", name="files-delete", status_code=200)
    async def delete_file(self, request: Request[Any, Any, Any], file_id: FromPath[str]) -> Response[bytes]:
        await self.visible_file(await caller_of(self.service, request), file_id)
        removed = await self.service.state.remove_file(file_id)
        if removed == "in_use":
            raise file_in_use(file_id)
        if removed is None:
            raise _not_found(file_id)
        try:
            await self.service.files.delete(removed.path)
        except FileStoreError as exc:  # the file is gone for every caller; its body stays behind
            log.error("batch file store: deleting %s left its body: %s", file_id, exc)
        return _json({"id": file_id, "object": "file", "deleted": True})


def files_controller(service: BatchService) -> type[FilesController]:
    return per_app(
        FilesController,
        service=service,
        guards=[upload_allowed(service)],
        request_max_body_size=service.options.max_file_bytes + _MULTIPART_SLACK,
    )
