"""The per-chunk bench's table: the floor's rows beside the gateway's and vllm-router's, or left out."""

from __future__ import annotations

from typing import Any

from loadtest.bench import stream_chunks


def _summary(with_peer: bool) -> dict[str, Any]:
    case: dict[str, Any] = {
        "old_us_per_answer": 10_240.0,
        "new_us_per_answer": 10_240.0,
        "floor_us_per_answer": 5_120.0,
        "new_vs_old": 1.0,
        "rounds_new_vs_old": [1.0],
        "new_vs_floor": 2.0,
        "rounds_new_vs_floor": [2.0],
        "old_answers_per_s": 10.0,
        "new_answers_per_s": 10.0,
        "floor_answers_per_s": 10.0,
    }
    if with_peer:
        case |= {
            "peer_us_per_answer": 4_096.0,
            "new_vs_peer": 2.5,
            "old_vs_peer": 2.5,
            "floor_vs_peer": 1.25,
            "rounds_new_vs_peer": [2.5],
            "peer_answers_per_s": 10.0,
        }
    return {"baseline": "main", "tokens": 512, "peer": "vllm-router", "cases": {"paced c=8": case}}


def test_the_table_puts_the_floor_per_chunk_beside_the_gateway_and_the_router() -> None:
    lines = stream_chunks.format_table(_summary(with_peer=True)).splitlines()
    floor_row = lines[lines.index(next(line for line in lines if line.startswith("the floor"))) + 2]
    assert floor_row.split() == ["paced", "c=8", "5120", "10.00", "2.000", "1.250"]


def test_without_the_router_the_floor_row_says_so_rather_than_guessing() -> None:
    table = stream_chunks.format_table(_summary(with_peer=False))
    assert "vllm-router in the same rounds" not in table
    floor_row = table.splitlines()[-1]
    assert floor_row.split() == ["paced", "c=8", "5120", "10.00", "2.000", "-"]
    summary = _summary(with_peer=False)
    for key in [k for k in summary["cases"]["paced c=8"] if k.startswith("floor") or "_floor" in k]:
        del summary["cases"]["paced c=8"][key]
    assert "the floor" not in stream_chunks.format_table(summary)  # --no-floor


def test_the_user_space_share_per_chunk_is_its_own_table() -> None:
    summary = _summary(with_peer=True)
    case = summary["cases"]["paced c=8"]
    case |= {"old_user_us_per_answer": 2_560.0, "new_user_us_per_answer": 2_048.0}
    case |= {"peer_user_us_per_answer": 1_024.0, "floor_user_us_per_answer": 512.0}
    summary["cases"]["json c=8"] = dict(case)  # not streamed: no per-chunk row
    lines = stream_chunks.format_table(summary).splitlines()
    at = lines.index("user-space CPU µs per chunk (the rest of each figure above is the kernel's)")
    assert lines[at + 1].split() == ["case", "old", "user", "new", "user", "peer", "user", "floor", "user"]
    assert lines[at + 2].split() == ["paced", "c=8", "5.00", "4.00", "2.00", "1.00"]
    assert len(lines) == at + 3
