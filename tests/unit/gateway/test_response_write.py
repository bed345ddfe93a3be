"""send_head_and_body: the bytes uvicorn's own `send` would write, and its cycle state, in one write."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.http.response_write import head_and_body_written, send_head_and_body
from gateway.tenants.answers import pairs

DEFAULTS = [(b"date", b"Thu, 26 Nov 2026 23:59:00 GMT"), (b"server", b"uvicorn")]
HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"x-request-id", b"req-1"),
    (b"x-ratelimit-remaining-requests", b"99"),
]


class Wire:
    """A transport that keeps what is written."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def cycle(keep_alive: bool = True) -> tuple[RequestResponseCycle, Wire, list[int]]:
    wire = Wire()
    responses: list[int] = []
    scope: Any = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "http_version": "1.1"}
    made = RequestResponseCycle(
        scope=scope,
        transport=wire,  # type: ignore[arg-type]
        flow=FlowControl(wire),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=list(DEFAULTS),
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: responses.append(1),
    )
    return made, wire, responses


def state(c: RequestResponseCycle) -> tuple[object, ...]:
    return (
        c.response_started,
        c.response_complete,
        c.chunked_encoding,
        c.expected_content_length,
        c.message_event.is_set(),
        c.keep_alive,
    )


async def both(
    headers: list[tuple[bytes, bytes]],
    body: bytes,
    more_body: bool,
    then: list[tuple[bytes, bool]],
    keep_alive=True,
    fixed: tuple[tuple[bytes, bytes], ...] = (),
) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """(writes, bytes, state, responses, closed) of uvicorn's own path and of send_head_and_body."""
    ours, ours_wire, ours_responses = cycle(keep_alive)
    theirs, theirs_wire, theirs_responses = cycle(keep_alive)
    await theirs.send({"type": "http.response.start", "status": 200, "headers": headers + list(fixed)})
    await theirs.send({"type": "http.response.body", "body": body, "more_body": more_body})
    await send_head_and_body(ours.send, 200, headers, body, more_body, fixed)
    for piece, more in then:
        for c in (theirs, ours):
            await c.send({"type": "http.response.body", "body": piece, "more_body": more})
    results = []
    for c, wire, responses in ((theirs, theirs_wire, theirs_responses), (ours, ours_wire, ours_responses)):
        results.append((len(wire.writes), b"".join(wire.writes), state(c), len(responses), wire.closed))
    return results[0], results[1]


async def test_a_whole_answer_is_one_write_of_the_same_bytes() -> None:
    body = b'{"id":"x"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    theirs, ours = await both(headers, body, False, [])
    assert theirs[0] == 2 and ours[0] == 1
    assert ours[1:] == theirs[1:]
    assert ours[1].endswith(b"\r\n\r\n" + body) and ours[3] == 1


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_a_stream_head_goes_with_its_first_piece_and_the_rest_follows_as_uvicorn_writes_it(
    keep_alive: bool,
) -> None:
    first, rest = b"data: {}\n\n", [(b"data: [DONE]\n\n", True), (b"", False)]
    theirs, ours = await both(HEADERS, first, True, rest, keep_alive)
    assert (theirs[0], ours[0]) == (4, 3)
    assert ours[1:] == theirs[1:]
    assert ours[4] is (not keep_alive)


async def test_a_stream_whole_in_its_first_piece_is_one_write() -> None:
    theirs, ours = await both(HEADERS, b"data: {}\n\ndata: [DONE]\n\n", False, [])
    assert (theirs[0], ours[0]) == (2, 1)
    assert ours[1:] == theirs[1:]


async def test_an_empty_first_piece_writes_the_head_only() -> None:
    theirs, ours = await both(HEADERS, b"", True, [(b"data: x\n\n", False)])
    assert ours[1:] == theirs[1:]


@pytest.mark.parametrize(
    "bad",
    [
        [(b"x-bad", b"a\r\nset-cookie: 1")],  # a value that would split the head
        [(b"bad name", b"1")],
    ],
)
async def test_a_header_uvicorn_refuses_is_refused_the_same_way(bad: list[tuple[bytes, bytes]]) -> None:
    ours, wire, _ = cycle()
    with pytest.raises(RuntimeError):
        await send_head_and_body(ours.send, 200, HEADERS + bad, b"data: {}\n\n", True)
    assert wire.writes == []


FIXED = ((b"x-switchyard-backend", b"gpu-a"), (b"x-switchyard-route", b"default"))


@pytest.mark.parametrize("more_body", [True, False])
async def test_fixed_headers_follow_the_others_as_uvicorn_writes_them(more_body: bool) -> None:
    body = b'{"id":"x"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    for _ in range(2):  # checked the first time, remembered the second
        theirs, ours = await both(headers, body, False, [], fixed=FIXED)
        assert ours[1:] == theirs[1:] and ours[0] == 1
    theirs, ours = await both(HEADERS, b"data: {}\n\n", more_body, [], fixed=FIXED)
    assert ours[1:] == theirs[1:] and ours[0] == 1


async def test_the_gateways_own_lines_follow_as_uvicorn_writes_them_as_headers() -> None:
    lines = b"x-ratelimit-limit-requests: 10\r\nx-ratelimit-remaining-requests: 9\r\n"
    body = b'{"id":"x"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    ours, wire, _ = cycle()
    theirs, theirs_wire, _ = cycle()
    await send_head_and_body(ours.send, 200, headers, body, False, FIXED, lines)
    await _two(theirs, [*headers, *FIXED, *pairs(lines)], body, more_body=False)
    assert len(wire.writes) == 1 and wire.writes[0] == b"".join(theirs_wire.writes)
    assert state(ours) == state(theirs)
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await send_head_and_body(send, 200, headers, body, False, FIXED, lines)
    assert messages[0]["headers"] == [*headers, *FIXED, *pairs(lines)]


@pytest.mark.parametrize(
    "headers, fixed",
    [
        ([*HEADERS, (b"x-request-id", b"r\r\nset-cookie: 1")], FIXED),  # from the client
        ([*HEADERS, (b"content-type", b"text/html\nx: 1")], FIXED),  # from a backend
        (HEADERS, ((b"x-switchyard-backend", b"gpu\r\nset-cookie: 1"),)),  # from the config
        (HEADERS, ((b"bad name", b"1"),)),
        (HEADERS, ((b"content-length", b"10"),)),
    ],
)
async def test_headers_refused_are_refused_every_time_names_or_fixed_were_seen_before(
    headers: list[tuple[bytes, bytes]], fixed: tuple[tuple[bytes, bytes], ...]
) -> None:
    await both(HEADERS, b"data: {}\n\n", True, [], fixed=FIXED)  # the good names and FIXED, remembered
    for _ in range(2):
        ours, wire, _ = cycle()
        theirs, theirs_wire, _ = cycle()
        outcomes = []
        for run in (
            send_head_and_body(ours.send, 200, headers, b"data: {}\n\n", True, fixed),
            _two(theirs, headers + list(fixed), b"data: {}\n\n"),
        ):
            try:
                await run
                outcomes.append(None)
            except RuntimeError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] == outcomes[1]
        assert b"".join(wire.writes) == b"".join(theirs_wire.writes)
        assert (outcomes[0] is None) is (fixed[0][0] == b"content-length")  # the rest: refused


@pytest.mark.parametrize(
    "extra",
    [[(b"Connection", b"close")], [(b"transfer-encoding", b"chunked")], [(b"content-length", b"99")]],
)
async def test_headers_uvicorn_acts_on_go_through_its_own_path(extra: list[tuple[bytes, bytes]]) -> None:
    body = b"data: {}\n\n"
    ours, ours_wire, _ = cycle()
    theirs, theirs_wire, _ = cycle()
    outcomes = []
    for run in (
        lambda: send_head_and_body(ours.send, 200, HEADERS + extra, body, True),
        lambda: _two(theirs, HEADERS + extra, body),
    ):
        try:
            await run()
            outcomes.append(None)
        except RuntimeError as exc:
            outcomes.append(str(exc))
    assert outcomes[0] == outcomes[1]
    assert b"".join(ours_wire.writes) == b"".join(theirs_wire.writes)
    assert state(ours) == state(theirs)


async def _two(
    c: RequestResponseCycle, headers: list[tuple[bytes, bytes]], body: bytes, more_body: bool = True
) -> None:
    await c.send({"type": "http.response.start", "status": 200, "headers": headers})
    await c.send({"type": "http.response.body", "body": body, "more_body": more_body})


async def test_any_other_send_gets_the_two_messages() -> None:
    messages: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await send_head_and_body(send, 200, HEADERS, b"data: {}\n\n", True)
    assert messages == [
        {"type": "http.response.start", "status": 200, "headers": HEADERS},
        {"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True},
    ]


async def test_a_client_gone_before_the_head_gets_nothing_written() -> None:
    ours, wire, responses = cycle()
    ours.disconnected = True
    await send_head_and_body(ours.send, 200, HEADERS, b"data: {}\n\n", False)
    assert wire.writes == [] and responses == []


@pytest.mark.parametrize("keep_alive", [True, False])
async def test_a_whole_answer_written_without_a_coroutine_is_what_uvicorn_writes(keep_alive: bool) -> None:
    body = b'{"id":"x"}'
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    fixed = ((b"x-switchyard-backend", b"b0"),)
    ours, wire, responses = cycle(keep_alive)
    theirs, theirs_wire, _ = cycle(keep_alive)
    await _two(theirs, headers + list(fixed) + pairs(b"x-request-id: req-1\r\n"), body, False)
    assert head_and_body_written(ours.send, 200, headers, body, fixed, b"x-request-id: req-1\r\n")
    assert wire.writes == [b"".join(theirs_wire.writes)] and state(ours) == state(theirs)
    assert responses == [1] and wire.closed is not keep_alive


async def test_an_answer_that_must_wait_or_go_through_uvicorn_is_not_written_without_a_coroutine() -> None:
    body = b"{}"
    headers = [(b"content-type", b"application/json"), (b"content-length", b"2")]
    paused, wire, _ = cycle()
    paused.flow.write_paused = True  # the client's side full: `send_head_and_body` waits for it
    assert not head_and_body_written(paused.send, 200, headers, body, (), b"")
    refused, refused_wire, _ = cycle()
    assert not head_and_body_written(refused.send, 200, [*headers, (b"bad", b"a\nb")], body, (), b"")

    async def send(message: dict[str, Any]) -> None: ...

    assert not head_and_body_written(send, 200, headers, body, (), b"")
    assert wire.writes == refused_wire.writes == [] and not paused.response_started


async def test_a_client_gone_gets_nothing_written_without_a_coroutine_either() -> None:
    ours, wire, responses = cycle()
    ours.disconnected = True
    assert head_and_body_written(ours.send, 200, HEADERS, b"{}", (), b"")
    assert wire.writes == [] and responses == []
