"""The simulator's Responses and Messages answers keep real vLLM's shape: the recordings in
tests/vllm/fixtures (responses*, messages*) replayed against the simulator, compared by key paths and by
the order of events."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.unit.backends.test_sim_contract import FIXTURES, INDEX, http, key_paths, sim  # noqa: F401


def typed_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    """(event name, decoded data) of an SSE body whose events are named (`event: ...` then `data: ...`)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        name, data = block.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: "), block
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


async def _replay(http: httpx.AsyncClient, name: str) -> httpx.Response:  # noqa: F811
    spec = INDEX["fixtures"][name]
    return await http.request(spec["method"], spec["path"], json=spec["request"])


@pytest.mark.parametrize(
    ("name", "client_reads"),
    [
        (
            "responses.json",
            {"id", "object", "status", "model", "output[].content[].text", "output[].type",
             "usage.input_tokens", "usage.output_tokens", "usage.total_tokens", "incomplete_details.reason"},
        ),
        (
            "messages.json",
            {"id", "type", "role", "model", "content[].type", "content[].text", "stop_reason",
             "usage.input_tokens", "usage.output_tokens"},
        ),
        ("error_messages_unknown_model.json", {"type", "error.type", "error.message"}),
    ],
)  # fmt: skip
async def test_bodies_invent_no_keys_and_have_what_clients_read(
    http: httpx.AsyncClient,  # noqa: F811
    name: str,
    client_reads: set[str],
) -> None:
    real = json.loads((FIXTURES / name).read_text())
    reply = await _replay(http, name)
    assert reply.status_code == INDEX["fixtures"][name]["status"]
    ours = key_paths(reply.json())
    assert client_reads <= key_paths(real), "the recording has what clients read"
    assert client_reads <= ours
    assert ours <= key_paths(real), sorted(ours - key_paths(real))


def _runs(events: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Event names with repeats squeezed: deltas group tokens as each step detokenised them."""
    return [n for i, (n, _) in enumerate(events) if i == 0 or events[i - 1][0] != n]


def _paths_by_event(events: list[tuple[str, dict[str, Any]]]) -> dict[str, set[str]]:
    paths: dict[str, set[str]] = {}
    for name, data in events:
        paths.setdefault(name, set()).update(key_paths(data))
    return paths


@pytest.mark.parametrize("name", ["responses_stream.sse", "messages_stream.sse"])
async def test_streams_send_the_same_events_in_the_same_order(http: httpx.AsyncClient, name: str) -> None:  # noqa: F811
    real = typed_events((FIXTURES / name).read_text())
    reply = await _replay(http, name)
    assert reply.status_code == 200
    ours = typed_events(reply.text)
    assert _runs(ours) == _runs(real)
    theirs = _paths_by_event(real)
    for event, paths in _paths_by_event(ours).items():
        assert paths <= theirs[event], (event, sorted(paths - theirs[event]))
