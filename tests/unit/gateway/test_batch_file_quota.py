"""Files and open batches against a key's quota, listing and deleting files: on the memory store and on
the real Redis (a private prefix). Quotas hold under concurrent calls; a refusal changes nothing."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from backends.yamlfile import ConfigError
from gateway.batch.objects import BatchObject, ErrorData, FileObject, StoredBatch, StoredFile
from gateway.batch.quota import Quota, quota_for
from gateway.batch.state import BatchState, UnknownCursor
from gateway.batch.transitions import to_failed, to_in_progress
from gateway.config.batches import BatchOptions
from gateway.config.settings import settings_from_text
from gateway.tenants.keys import KeyRecord
from tests.unit.gateway.test_batch_state import _each_state

UNLIMITED = Quota(max_file_bytes=1 << 30, max_stored_files=None, max_stored_bytes=None, max_open_batches=None)


def _file(owner: str = "key-a", size: int = 10, purpose: str = "batch") -> StoredFile:
    file_id = "file-" + uuid.uuid4().hex
    meta = FileObject(id=file_id, bytes=size, created_at=1, filename="in.jsonl", purpose=purpose)
    return StoredFile(file=meta, owner=owner, path=f"files/{file_id}")


def _batch(input_file_id: str, owner: str = "key-a") -> StoredBatch:
    batch = BatchObject(
        id="batch_" + uuid.uuid4().hex,
        endpoint="/v1/chat/completions",
        input_file_id=input_file_id,
        completion_window="24h",
        status="validating",
        created_at=1,
    )
    return StoredBatch(batch=batch, owner=owner)


async def _ids(state: BatchState, owner: str | None) -> list[str]:
    found, _ = await state.list_files(owner, None, 10_000, "asc", None)
    return [f.file.id for f in found]


def _ended(stored: StoredBatch) -> StoredBatch:
    return msgspec.structs.replace(stored, batch=msgspec.structs.replace(stored.batch, status="cancelled"))


def test_a_keys_own_fields_override_the_config_and_uploads_stay_under_the_configs_cap() -> None:
    options = BatchOptions(
        max_file_bytes=4096, max_stored_files=10, max_stored_bytes=None, max_open_batches=2
    )
    assert quota_for(options, None) == Quota(4096, 10, None, 2)
    key = KeyRecord(id="k", max_file_bytes=1 << 40, max_stored_files=3, max_open_batches=0)
    assert quota_for(options, key) == Quota(4096, 3, None, 0)
    assert quota_for(options, KeyRecord(id="k", max_file_bytes=2048)).max_file_bytes == 2048


@_each_state
async def test_files_over_the_count_or_the_bytes_are_refused_and_recorded_nowhere(state: BatchState) -> None:
    quota = Quota(max_file_bytes=1 << 30, max_stored_files=2, max_stored_bytes=100, max_open_batches=None)
    first, second = _file(size=40), _file(size=40)
    assert await state.add_file(first, quota) is None
    over_bytes = _file(size=61)
    assert await state.add_file(over_bytes, quota) == "max_stored_bytes"
    assert await state.add_file(second, quota) is None
    third = _file(size=1)
    assert await state.add_file(third, quota) == "max_stored_files"
    assert await state.get_file(third.file.id) is None and await state.get_file(over_bytes.file.id) is None
    assert await _ids(state, "key-a") == [first.file.id, second.file.id]
    assert await state.add_file(_file(owner="key-b", size=100), quota) is None  # another key's own quota
    # Deleting frees both the count and the bytes.
    assert await state.remove_file(first.file.id) == first
    assert await state.add_file(_file(size=60), quota) is None
    assert await state.add_file(_file(size=1), quota) == "max_stored_files"


@_each_state
async def test_concurrent_uploads_cannot_go_over_the_quota_together(state: BatchState) -> None:
    quota = Quota(max_file_bytes=1 << 30, max_stored_files=5, max_stored_bytes=None, max_open_batches=None)
    answers = await asyncio.gather(*(state.add_file(_file(), quota) for _ in range(40)))
    assert answers.count(None) == 5 and answers.count("max_stored_files") == 35
    by_bytes = Quota(
        max_file_bytes=1 << 30, max_stored_files=None, max_stored_bytes=70, max_open_batches=None
    )
    answers = await asyncio.gather(
        *(state.add_file(_file(owner="key-b", size=10), by_bytes) for _ in range(40))
    )
    assert answers.count(None) == 7
    assert len(await _ids(state, "key-a")) == 5 and len(await _ids(state, "key-b")) == 7


@_each_state
async def test_an_output_written_again_counts_once(state: BatchState) -> None:
    output = _file(size=30, purpose="batch_output")
    await state.put_file(output)
    await state.put_file(output)  # a replica that took over finalizing writes it again
    quota = Quota(max_file_bytes=1 << 30, max_stored_files=2, max_stored_bytes=100, max_open_batches=None)
    assert await state.add_file(_file(size=70), quota) is None
    assert await state.add_file(_file(size=1), quota) == "max_stored_files"


@_each_state
async def test_open_batches_over_the_quota_are_refused_even_when_racing(state: BatchState) -> None:
    source = _file()
    assert await state.add_file(source, UNLIMITED) is None
    answers = await asyncio.gather(*(state.create(_batch(source.file.id), max_open=3) for _ in range(20)))
    assert answers.count(None) == 3 and answers.count("max_open_batches") == 17
    page, _ = await state.page("key-a", None, 100)
    assert len(page) == 3
    assert (
        await state.update(page[0].batch.id, to_failed(ErrorData(code="invalid_file", message="gone")))
        is not None
    )  # one ends
    assert await state.create(_batch(source.file.id), max_open=3) is None
    assert await state.create(_batch(source.file.id), max_open=3) == "max_open_batches"
    assert await state.create(_batch(source.file.id, owner="key-b"), max_open=3) is None


@_each_state
async def test_a_file_read_by_a_batch_not_ended_cannot_be_deleted(state: BatchState) -> None:
    source = _file()
    assert await state.add_file(source, UNLIMITED) is None
    batch = _batch(source.file.id)
    assert await state.create(batch) is None
    assert await state.remove_file(source.file.id) == "in_use"
    assert await state.update(batch.batch.id, to_in_progress(1, "m")) is not None
    assert await state.remove_file(source.file.id) == "in_use"
    assert await state.get_file(source.file.id) == source
    # A batch ended: the file may go, once; a batch on a deleted file is not recorded.
    other = _batch(source.file.id)
    assert await state.create(other) is None
    for stored in (batch, other):
        await state.update(stored.batch.id, _ended)
    assert await state.remove_file(source.file.id) == source
    assert await state.remove_file(source.file.id) is None
    late = _batch(source.file.id)
    assert await state.create(late) == "no_file"
    assert await state.get(late.batch.id) is None


@_each_state
async def test_listing_pages_in_either_order_by_purpose_and_past_a_deleted_cursor(state: BatchState) -> None:
    mine = [_file() for _ in range(5)]
    for stored in mine:
        assert await state.add_file(stored, UNLIMITED) is None
    theirs = _file(owner="key-b")
    assert await state.add_file(theirs, UNLIMITED) is None
    output = _file(purpose="batch_output")
    await state.put_file(output)
    ids = [f.file.id for f in mine] + [output.file.id]

    page, more = await state.list_files("key-a", None, 4, "desc", None)
    assert [f.file.id for f in page] == ids[::-1][:4] and more
    rest, more = await state.list_files("key-a", page[-1].file.id, 4, "desc", None)
    assert [f.file.id for f in rest] == ids[::-1][4:] and not more
    page, more = await state.list_files("key-a", ids[1], 2, "asc", None)
    assert [f.file.id for f in page] == ids[2:4] and more
    page, more = await state.list_files("key-a", None, 10, "asc", "batch_output")
    assert [f.file.id for f in page] == [output.file.id] and not more
    page, _ = await state.list_files("key-a", None, 10, "desc", "batch")
    assert [f.file.id for f in page] == [f.file.id for f in mine][::-1]
    # Every file for the admin (owner None); another key's id is no cursor in key-a's list.
    assert set(await _ids(state, None)) >= {*ids, theirs.file.id}
    with pytest.raises(UnknownCursor):
        await state.list_files("key-a", theirs.file.id, 10, "desc", None)
    with pytest.raises(UnknownCursor):
        await state.list_files("key-a", "file-never", 10, "desc", None)
    # A cleanup job deletes each file of the page it read, then asks for the next page after the last.
    page, _ = await state.list_files("key-a", None, 2, "desc", None)
    for stored in page:
        assert await state.remove_file(stored.file.id) == stored
    rest, more = await state.list_files("key-a", page[-1].file.id, 2, "desc", None)
    assert [f.file.id for f in rest] == ids[::-1][2:4] and more
    with pytest.raises(UnknownCursor):  # a deleted file of key-a's is still no cursor for key-b
        await state.list_files("key-b", page[-1].file.id, 2, "desc", None)


@pytest.mark.parametrize("field", ["max_stored_files", "max_stored_bytes", "max_open_batches"])
def test_a_negative_quota_in_the_config_is_refused_at_its_line(field: str) -> None:
    text = (
        "pools: [{name: a, vendor: nvidia, accelerator: h100, price_per_gpu_hour: 1,\n"
        "  backends: [{url: 'http://127.0.0.1:1', models: [m], max_model_len: 10}]}]\n"
        f"batches:\n  {field}: -1\n"
    )
    with pytest.raises(ConfigError, match=rf"<config>:4: .*>= 0 \(at batches\.{field}\)"):
        settings_from_text(text)
    unlimited = settings_from_text(text.replace("-1", "null")).batches
    assert getattr(unlimited, field) is None
