"""The ledger spill file: append, torn lines, truncation only when drained, one owner at a time."""

from __future__ import annotations

from collections import deque
from pathlib import Path

from gateway.ledger.records import UsageRecord
from gateway.ledger.spill import LedgerSpill
from tests.unit.ledger.test_ledger_contract import rec


async def test_appends_only_what_is_new_and_truncates_once_drained(tmp_path: Path) -> None:
    spill = LedgerSpill(tmp_path / "s.spill")
    assert spill.claim()
    buffer: deque[UsageRecord] = deque(rec(f"r{i}") for i in range(3))
    await spill.append_new(buffer)
    buffer.append(rec("r3"))
    await spill.append_new(buffer)
    await spill.append_new(buffer)  # nothing new
    assert len(spill.path.read_bytes().splitlines()) == 4
    buffer.popleft()
    spill.acknowledged(1)
    await spill.clear_if_drained(buffer)  # not drained: the file keeps everything
    assert len(spill.path.read_bytes().splitlines()) == 4
    buffer.clear()
    spill.acknowledged(3)
    await spill.clear_if_drained(buffer)
    assert spill.path.read_bytes() == b""
    spill.release()
    assert not spill.path.exists()  # an empty spill file is removed at a clean shutdown


async def test_a_torn_last_line_is_skipped_on_load(tmp_path: Path) -> None:
    first = LedgerSpill(tmp_path / "s.spill")
    assert first.claim()
    await first.append_new(deque([rec("a"), rec("b")]))
    first.release()
    with first.path.open("ab") as file:
        file.write(b'{"request_id":"c","endpo')  # killed mid-write
    second = LedgerSpill(first.path)
    assert second.claim()
    assert [r.request_id for r in second.load()] == ["a", "b"]
    assert second.dirty and second.on_disk == 2
    second.release()


def test_only_one_process_owns_a_spill_file(tmp_path: Path) -> None:
    owner, other = LedgerSpill(tmp_path / "s.spill"), LedgerSpill(tmp_path / "s.spill")
    assert owner.claim()
    assert not other.claim()  # flock is per open file: a second claim fails even in one process
    owner.release()
    assert other.claim()
    other.release()
