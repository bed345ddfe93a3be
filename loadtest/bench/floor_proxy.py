"""The least a Python proxy can do per request: the floor under the gateway's CPU (bench/cpu_layers.py).

The gateway's own stack (uvloop, httptools) and nothing else: each request parsed, forwarded as its client
sent it over a kept-alive connection to the one upstream, the answer written back read by read as it came
(a streamed answer chunk by chunk) and parsed only to tell where it ends. No header rewritten, no routing,
limits, accounting or telemetry: what serving and relaying alone cost in Python. A benchmark target, not a
gateway (no bounds, no errors in OpenAI's shape).

Usage: python -m loadtest.bench.floor_proxy --port PORT --upstream http://127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import cast
from urllib.parse import urlsplit

import httptools
import uvloop


class _Upstream(asyncio.Protocol):
    def __init__(self, idle: list[_Upstream]) -> None:
        self._idle = idle
        self._parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's, not a subclass

    def data_received(self, data: bytes) -> None:
        """Each read goes to the client as it came (a streamed answer chunk by chunk), then is parsed only
        to tell where the answer ends."""
        if self.client is not None:
            self.client.answer(data)
        self._parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client = None
        if self._parser.should_keep_alive():
            self._idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self._idle:
            self._idle.remove(self)
        if self.client is not None:
            self.client.fail()


class _Client(asyncio.Protocol):
    def __init__(
        self, loop: asyncio.AbstractEventLoop, upstream: tuple[str, int], idle: list[_Upstream]
    ) -> None:
        self._loop = loop
        self._upstream = upstream
        self._idle = idle
        self._parser = httptools.HttpRequestParser(self)
        self._pieces: list[bytes] = []
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._pieces.append(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.fail()

    def on_message_complete(self) -> None:
        request = b"".join(self._pieces)
        self._pieces = []
        self._loop.create_task(self._forward(request))

    async def _forward(self, request: bytes) -> None:
        idle = self._idle
        if idle:
            upstream = idle.pop()
        else:
            host, port = self._upstream
            try:
                _, upstream = await self._loop.create_connection(lambda: _Upstream(idle), host, port)
            except OSError:
                self.fail()
                return
        upstream.client = self
        assert upstream.transport is not None
        upstream.transport.write(request)

    def answer(self, data: bytes) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def fail(self) -> None:
        if self._transport is not None:
            self._transport.close()


async def serve(port: int, upstream: tuple[str, int]) -> None:
    loop = asyncio.get_running_loop()
    idle: list[_Upstream] = []
    server = await loop.create_server(lambda: _Client(loop, upstream, idle), "127.0.0.1", port, backlog=2048)
    await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    args = parser.parse_args(argv)
    where = urlsplit(args.upstream)
    if where.hostname not in ("127.0.0.1", "localhost", "::1") or where.port is None:
        parser.error("--upstream must be a loopback http://host:port")
    uvloop.run(serve(args.port, (where.hostname, where.port)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
