"""The backend HTTP/1.1 client against a raw asyncio server on 127.0.0.1 that writes exact bytes:
keep-alive reuse, the connection limit, idle connections the server closed, framing (length, chunked,
until close), flow control, malformed answers and refused connections."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest

from gateway.upstream.client import (
    BackendClient,
    ConnectFailed,
    ConnectionBroken,
)
from gateway.upstream.connection import MAX_HEAD_BYTES
from tests.support import free_port

OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


@dataclass
class RawServer:
    """Answers each request on a connection with `answer(request_head, connection_number)`."""

    answer: Callable[[bytes, int], bytes | None]
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                reply = self.answer(head + body, number)
                if reply is None:  # hang up without answering
                    writer.close()
                    return
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def serve(answer: Callable[[bytes, int], bytes | None]) -> tuple[RawServer, asyncio.Server]:
    state = RawServer(answer)
    port = free_port()
    state.url = f"http://127.0.0.1:{port}"
    server = await asyncio.start_server(state.handle, "127.0.0.1", port)
    return state, server


@contextlib.asynccontextmanager
async def backend(
    answer: Callable[[bytes, int], bytes | None], limit: int = 4, keepalive: float = 4.0
) -> AsyncIterator[tuple[RawServer, BackendClient]]:
    """A raw server answering with `answer` and a client to it, both closed at the end."""
    state, server = await serve(answer)
    client = BackendClient(limit_per_backend=limit, keepalive=keepalive)
    try:
        yield state, client
    finally:
        client.close()
        server.close()


async def test_sequential_requests_reuse_one_connection_and_send_exact_bytes() -> None:
    async with backend(lambda _req, _n: OK) as (state, client):
        for i in range(5):
            response = await client.post(
                state.url, "/v1/chat/completions", b"X-Request-Id: r%d\r\n" % i, b'{"a":1}', 1.0
            )
            assert response.status == 200 and response.content_type == "application/json"
            assert await response.read() == b"{}"
            response.release()
            assert not response.closed
        assert state.connections == 1
        assert state.requests[0] == (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nX-Request-Id: r0\r\n"
            b'Content-Length: 7\r\n\r\n{"a":1}' % int(state.url.rsplit(":", 1)[1])
        )


async def test_a_path_prefix_in_the_backend_url_is_kept() -> None:
    async with backend(lambda _req, _n: OK) as (state, client):
        response = await client.post(state.url + "/tenant-a/", "/v1/completions", b"", b"{}", 1.0)
        await response.read()
        response.release()
        assert state.requests[0].startswith(b"POST /tenant-a/v1/completions HTTP/1.1\r\n")


async def test_the_connection_limit_queues_requests_instead_of_opening_more() -> None:
    release = asyncio.Event()
    async with backend(lambda _req, _n: OK, limit=2) as (state, client):

        async def one() -> bytes:
            response = await client.post(state.url, "/x", b"", b"{}", 1.0)
            await release.wait()
            body = await response.read()
            response.release()
            return body

        tasks = [asyncio.create_task(one()) for _ in range(6)]
        await asyncio.sleep(0.1)
        assert state.connections == 2 and len(state.requests) == 2  # four wait for a free connection
        release.set()
        assert await asyncio.gather(*tasks) == [b"{}"] * 6
        assert state.connections == 2 and len(state.requests) == 6
        assert client.pool(state.url).open_connections == 2


async def test_an_idle_connection_the_backend_closed_is_replaced_without_an_error() -> None:
    async with backend(lambda _req, _n: OK) as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        await response.read()
        response.release()
        for writer in state.writers:  # the backend's keep-alive timeout fires
            writer.close()
        await asyncio.sleep(0.05)
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert await response.read() == b"{}"
        response.release()
        assert state.connections == 2 and len(state.requests) == 2


async def test_a_stale_connection_is_not_reused_past_the_keepalive_time() -> None:
    async with backend(lambda _req, _n: OK, keepalive=0.05) as (state, client):
        for _ in range(2):
            response = await client.post(state.url, "/x", b"", b"{}", 1.0)
            await response.read()
            response.release()
            await asyncio.sleep(0.1)
        assert state.connections == 2


async def test_connection_close_answers_are_not_pooled() -> None:
    answer = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
    async with backend(lambda _req, _n: answer) as (state, client):
        for _ in range(2):
            response = await client.post(state.url, "/x", b"", b"{}", 1.0)
            assert await response.read() == b"{}"
            response.release()
            assert response.closed
        assert state.connections == 2


async def test_chunked_events_arrive_as_they_are_sent_then_the_end() -> None:
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    async with backend(lambda _req, _n: head) as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert response.content_type == "text/event-stream"
        writer = state.writers[0]
        writer.write(b"8\r\ndata: 1\n\r\n")
        assert await response.readany() == b"data: 1\n"
        writer.write(b"8\r\ndata: 2\n\r\n0\r\n\r\n")
        assert await response.readany() == b"data: 2\n"
        assert await response.readany() == b""
        response.release()
        assert not response.closed and client.pool(state.url).idle_connections == 1


async def test_a_body_delimited_by_the_end_of_the_connection() -> None:
    async with backend(lambda _req, _n: b"HTTP/1.1 200 OK\r\n\r\n") as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        state.writers[0].write(b"all of it")
        state.writers[0].close()
        assert await response.read() == b"all of it"
        response.release()
        assert response.closed


async def test_headers_are_read_from_a_head_that_arrives_a_byte_at_a_time() -> None:
    """Headers are looked up in the bytes httptools parsed, not collected per header: names match in any
    case, values keep theirs, OWS is stripped, the last of a repeated header wins, a name inside another
    header's value is not a header, and each answer keeps its own head once its connection carries the
    next."""
    first = (
        b"HTTP/1.1 429 Too Many Requests\r\nX-Note: retry-after: 99\r\nRETRY-after:   7 \r\n"
        b"Retry-After:\t3\r\ncontent-TYPE: Application/JSON; Charset=UTF-8\r\nContent-Length: 2\r\n\r\n{}"
    )
    second = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]"
    asked = asyncio.Event()

    def nothing_yet(_req: bytes, _n: int) -> bytes:
        asked.set()
        return b""  # the test writes the answer itself

    async with backend(nothing_yet, limit=1) as (state, client):
        sending = asyncio.ensure_future(client.post(state.url, "/x", b"", b"{}", 1.0))
        await asked.wait()
        for byte in first:
            state.writers[0].write(bytes([byte]))
            await state.writers[0].drain()
            await asyncio.sleep(0)
        response = await sending
        assert response.status == 429 and await response.read() == b"{}"
        response.release()
        assert not response.closed
        state.answer = lambda _req, _n: second
        again = await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert await again.read() == b"[]" and state.connections == 1
        again.release()
        assert response.header("retry-after") == "3"
        assert response.header("x-note") == "retry-after: 99"
        assert response.header("content-type") == "Application/JSON; Charset=UTF-8"
        assert response.content_type == "application/json"
        assert response.header("content-length") == "2" and response.header("missing") is None
        assert again.header("retry-after") is None and again.content_type == "application/octet-stream"


async def test_a_head_that_never_ends_is_a_broken_connection_not_a_growing_buffer() -> None:
    """Header lines past MAX_HEAD_BYTES without the head's end fail the exchange at once (not when the
    attempt times out, holding all of it); a head that ends within the limit, with a large body in the
    same read, is an answer."""
    endless = b"HTTP/1.1 200 OK\r\n" + b"X-Filler: %s\r\n" % (b"a" * 1000) * (MAX_HEAD_BYTES // 1000 + 2)
    async with backend(lambda _req, _n: endless) as (state, client):
        with pytest.raises(ConnectionBroken, match="not complete after"):
            await asyncio.wait_for(client.post(state.url, "/x", b"", b"{}", 1.0), 5)
        assert client.pool(state.url).idle_connections == 0
    big = b"x" * (4 * MAX_HEAD_BYTES)
    whole = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(big), big)
    async with backend(lambda _req, _n: whole) as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert await response.read() == big and response.header("content-length") == str(len(big))
        response.release()


async def test_a_large_answer_is_read_whole_through_flow_control() -> None:
    big = bytes(range(256)) * 8192  # 2 MiB, over the read high-water mark
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(big) + big
    async with backend(lambda _req, _n: answer) as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        await asyncio.sleep(0.1)  # let the socket fill while nobody reads
        assert await response.read() == big
        response.release()
        assert not response.closed


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\npartial\r\n",
    ],
    ids=["content-length", "chunked"],
)
async def test_a_drop_mid_answer_is_a_broken_connection(answer: bytes) -> None:
    async with backend(lambda _req, _n: answer) as (state, client):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert await response.readany() == b"partial"
        state.writers[0].close()
        with pytest.raises(ConnectionBroken):
            await response.readany()
        response.close()
        await asyncio.sleep(0.01)
        assert client.pool(state.url).open_connections == 0


async def test_no_answer_at_all_on_a_fresh_connection_is_a_broken_connection() -> None:
    async with backend(lambda _req, _n: None) as (state, client):
        with pytest.raises(ConnectionBroken):
            await client.post(state.url, "/x", b"", b"{}", 1.0)
        assert len(state.requests) == 1  # a fresh connection is not retried


async def test_garbage_instead_of_http_is_a_broken_connection() -> None:
    async with backend(lambda _req, _n: b"SSH-2.0-OpenSSH_9.2\r\n\r\n") as (state, client):
        with pytest.raises(ConnectionBroken, match="not valid HTTP"):
            await client.post(state.url, "/x", b"", b"{}", 1.0)


async def test_a_refused_connection_frees_its_slot() -> None:
    client = BackendClient(limit_per_backend=1, keepalive=4.0)
    url = f"http://127.0.0.1:{free_port()}"
    try:
        for _ in range(3):
            with pytest.raises(ConnectFailed):
                await client.post(url, "/x", b"", b"{}", 1.0)
        assert client.pool(url).open_connections == 0
    finally:
        client.close()


async def test_cancelling_an_exchange_aborts_its_connection() -> None:
    async with backend(lambda _req, _n: b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", limit=1) as (
        state,
        client,
    ):
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)
        reading = asyncio.create_task(response.read())
        await asyncio.sleep(0.05)
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        await asyncio.sleep(0.05)
        pool = client.pool(state.url)
        assert pool.open_connections == 0
        state.answer = lambda _req, _n: OK
        response = await client.post(state.url, "/x", b"", b"{}", 1.0)  # the slot is free again
        assert await response.read() == b"{}"
        response.release()


def test_only_http_urls_are_accepted() -> None:
    client = BackendClient(limit_per_backend=1, keepalive=4.0)
    with pytest.raises(ValueError, match="not http"):
        asyncio.run(client.post("ftp://127.0.0.1:1", "/x", b"", b"", 1.0))
