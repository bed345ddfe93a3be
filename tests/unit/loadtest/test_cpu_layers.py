"""The layers bench: its floor proxy relays what it is sent (a streamed answer read by read, as it comes),
and its table subtracts the right rows."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from loadtest.bench import cpu_layers, floor_proxy
from loadtest.processes import free_port


async def _upstream(seen: list[bytes], close_after: int) -> tuple[asyncio.Server, int]:
    """An HTTP/1.1 upstream answering each request with its number; it closes the connection (saying so)
    after `close_after` answers on it."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answered = 0
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                seen.append(head + await reader.readexactly(length))
                answered += 1
                last = answered == close_after
                body = b"%d" % len(seen)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%b\r\n%b"
                    % (len(body), b"connection: close\r\n" if last else b"", body)
                )
                await writer.drain()
                if last:
                    break
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def _post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, body: bytes) -> bytes:
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)
    )
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    return await reader.readexactly(length)


@contextlib.asynccontextmanager
async def _through_floor(
    upstream: asyncio.Server,
) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A client connection through a floor proxy in front of `upstream`; both stopped after."""
    port = free_port()
    proxy = asyncio.create_task(floor_proxy.serve(port, ("127.0.0.1", upstream.sockets[0].getsockname()[1])))
    try:
        for _ in range(50):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield reader, writer
        writer.close()
    finally:
        proxy.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await proxy
        upstream.close()
        await upstream.wait_closed()


async def test_the_floor_proxy_relays_requests_and_answers_verbatim_over_kept_alive_connections() -> None:
    seen: list[bytes] = []
    upstream, _ = await _upstream(seen, close_after=2)
    async with _through_floor(upstream) as (reader, writer):
        # five requests on one client connection: the upstream closes its side after every second answer,
        # and the proxy opens a new one rather than sending into the closed one
        answers = [await _post(reader, writer, b'{"n":%d}' % i) for i in range(5)]
        assert answers == [b"1", b"2", b"3", b"4", b"5"]
        assert [s.rpartition(b"\r\n\r\n")[2] for s in seen] == [b'{"n":%d}' % i for i in range(5)]
        assert all(s.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n") for s in seen)


async def test_the_floor_proxy_relays_a_streamed_answer_as_it_arrives_then_reuses_the_connection() -> None:
    rest = asyncio.Event()
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                await reader.readexactly(int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0]))
                writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n")
                await writer.drain()
                await rest.wait()  # the rest only once the client has had the first chunk
                writer.write(b"7\r\ndata: 2\r\n0\r\n\r\n")
                await writer.drain()
        writer.close()

    upstream = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with _through_floor(upstream) as (reader, writer):
        for _ in range(2):
            rest.clear()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
            first = await asyncio.wait_for(reader.readuntil(b"data: 1\r\n"), 5)
            assert first.startswith(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n")
            rest.set()
            assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5) == b"7\r\ndata: 2\r\n0\r\n\r\n"
        assert connections == 1  # the second request went over the first's upstream connection


def test_the_floor_proxy_only_relays_to_a_loopback_upstream() -> None:
    with pytest.raises(SystemExit) as refused:
        floor_proxy.main(["--port", "1", "--upstream", "http://example.com:80"])
    assert refused.value.code == 2


def test_the_table_says_what_each_layer_costs_at_each_concurrency() -> None:
    def row(cpu: float) -> dict[str, float]:
        return {"rps": 1000.0, "p50_ms": 1.0, "cpu_us": cpu}

    summary = {
        "connections": [64, 8],
        "medians": {
            "floor": {"64": row(15.0), "8": row(18.0)},
            "open": {"64": row(80.0), "8": row(92.0)},
            "keys": {"64": row(84.0), "8": row(108.0)},
            "vllm-router": {"64": row(84.0), "8": row(80.0)},
        },
    }
    table = cpu_layers.format_table(summary)
    assert "at 64 connections: open - floor 65.0, keys - open 4.0, keys / vllm-router 1.00x" in table
    assert "at 8 connections: open - floor 74.0, keys - open 16.0, keys / vllm-router 1.35x" in table
    del summary["medians"]["vllm-router"]  # not installed: left out, not guessed
    assert "vllm-router" not in cpu_layers.format_table(summary)


@pytest.mark.parametrize(
    "argv",
    [["--connections", "0"], ["--connections", "8,x"], ["--rounds", "0"], ["--duration", "500"]],
)
def test_bad_arguments_are_refused_before_anything_starts(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        cpu_layers.main(argv)
    assert refused.value.code == 2
