"""Reading a batch's input, and writing its output and error files once every line has an end."""

from __future__ import annotations

import msgspec

from gateway.batch.lines import custom_id_of, error_line
from gateway.batch.objects import ErrorData, FileObject, RequestCounts, StoredBatch, StoredFile, now
from gateway.batch.service import BatchService
from gateway.batch.transitions import to_final

_decoder = msgspec.json.Decoder()


def split_lines(data: bytes) -> list[bytes]:
    return [line for line in (raw.strip() for raw in data.splitlines()) if line]


def first_model(lines: list[bytes]) -> str | None:
    for raw in lines:
        try:
            line = _decoder.decode(raw)
        except msgspec.DecodeError:
            continue
        body = line.get("body") if isinstance(line, dict) else None
        model = body.get("model") if isinstance(body, dict) else None
        if isinstance(model, str):
            return model
    return None


async def read_input(
    service: BatchService, stored: StoredBatch
) -> tuple[list[bytes], str | None] | ErrorData:
    """The input's lines and the model they ask for, or why the batch cannot run at all."""
    file_id = stored.batch.input_file_id
    meta = await service.state.get_file(file_id)
    data = await service.files.get(meta.path) if meta is not None else None
    if data is None:
        return ErrorData(
            code="invalid_file", message=f"Input file `{file_id}` is gone.", param="input_file_id"
        )
    lines = split_lines(data)
    if not lines:
        return ErrorData(code="empty_file", message="The input file has no requests.", param="input_file_id")
    if len(lines) > service.options.max_lines:
        message = (
            f"The input file has {len(lines)} requests; at most {service.options.max_lines} are allowed."
        )
        return ErrorData(code="too_many_requests", message=message, param="input_file_id")
    return lines, first_model(lines)


async def _store_file(service: BatchService, stored: StoredBatch, kind: str, data: bytes) -> str:
    file_id = f"file-{stored.batch.id.removeprefix('batch_')}{kind}"
    path = f"files/{file_id}"
    await service.files.put(path, data)
    meta = FileObject(
        id=file_id,
        bytes=len(data),
        created_at=now(),
        filename=f"{stored.batch.id}_{kind}.jsonl",
        purpose=f"batch_{kind}",
    )
    await service.state.put_file(StoredFile(file=meta, owner=stored.owner, path=path))
    return file_id


def _unfinished_error(stored: StoredBatch, ending: str) -> tuple[str, str] | None:
    """The error line's code and message for each line a batch ending `ending` did not finish."""
    if ending == "expired":
        return "batch_expired", "This request could not be executed before the completion window expired."
    if stored.stop is not None:
        return stored.stop.code, f"This request was not sent: {stored.stop.message}"
    return None


async def finalize(service: BatchService, stored: StoredBatch, ending: str) -> StoredBatch | None:
    """Write the output and error files (lines in input order) and end the batch. Idempotent: the file
    ids follow from the batch's, so a replica that takes over a half-done finalization rewrites them."""
    batch_id = stored.batch.id
    results = await service.state.results(batch_id)
    output: list[bytes] = []
    errors: list[bytes] = []
    for line in sorted(results):
        ref = results[line]
        text = await service.files.get(ref[2:])
        if text is None:
            continue
        (errors if ref.startswith("e:") else output).append(text)
    completed, failed = len(output), len(errors)
    total = stored.batch.request_counts.total
    unfinished = _unfinished_error(stored, ending)
    if unfinished is not None and len(results) < total:
        data = await read_input(service, stored)
        inputs = data[0] if not isinstance(data, ErrorData) else []
        code, message = unfinished
        for line in range(total):
            if line not in results:
                raw = inputs[line] if line < len(inputs) else b""
                errors.append(error_line(custom_id_of(raw), code, message).text)
                failed += 1
    output_id = await _store_file(service, stored, "output", b"\n".join(output) + b"\n") if output else None
    error_id = await _store_file(service, stored, "error", b"\n".join(errors) + b"\n") if errors else None
    counts = RequestCounts(total=total, completed=completed, failed=failed)
    return await service.state.update(batch_id, to_final(ending, output_id, error_id, counts))
