"""body_at_hand: a request body uvicorn's cycle holds whole, taken as its `receive` would take it."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.http.asgi_io import body_at_hand, read_body
from gateway.openai.errors import GatewayError
from tests.unit.gateway.test_response_write import cycle

SCOPE: Any = {"headers": [(b"content-type", b"application/json")]}


def arrived(body: bytes, more_body: bool = False) -> Any:
    made, _, _ = cycle()
    made.body = bytearray(body)
    made.more_body = more_body
    made.message_event.set()
    return made


def after(c: Any) -> tuple[object, ...]:
    return (bytes(c.body), c.message_event.is_set(), c.more_body, c.flow.read_paused)


async def test_a_whole_body_is_taken_as_receive_takes_it() -> None:
    ours, theirs = arrived(b'{"model":"m"}'), arrived(b'{"model":"m"}')
    ours.flow.read_paused = theirs.flow.read_paused = True  # the body filled uvicorn's buffer
    assert body_at_hand(SCOPE, ours.receive, 1000) == await read_body(SCOPE, theirs.receive, 1000)
    assert after(ours) == after(theirs) == (b"", False, False, False)


@pytest.mark.parametrize("state", ["more_body", "disconnected", "response_complete", "not_arrived", "100"])
async def test_a_body_not_all_here_is_left_to_receive(state: str) -> None:
    c = arrived(b"{}", more_body=state == "more_body")
    c.disconnected = state == "disconnected"
    c.response_complete = state == "response_complete"
    c.waiting_for_100_continue = state == "100"
    if state == "not_arrived":
        c.message_event.clear()
    before = after(c)
    assert body_at_hand(SCOPE, c.receive, 1000) is None and after(c) == before


async def test_any_other_receive_is_left_alone() -> None:
    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}"}

    assert body_at_hand(SCOPE, receive, 1000) is None


async def test_a_body_past_the_limit_is_refused_by_its_length_or_its_bytes() -> None:
    declared: Any = {"headers": [(b"content-length", b"5000")]}
    with pytest.raises(GatewayError) as by_length:
        body_at_hand(declared, arrived(b"{}").receive, 1000)
    with pytest.raises(GatewayError) as by_bytes:
        body_at_hand(SCOPE, arrived(b"x" * 1001).receive, 1000)
    assert by_length.value.status == by_bytes.value.status == 413
