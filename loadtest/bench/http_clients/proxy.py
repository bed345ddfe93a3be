"""The bare Litestar proxy under test and its three forwarding clients (httpx, aiohttp, the gateway's own)."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from typing import Any, Protocol

from backends.lifetime import end_with_parent
from loadtest.bench._util import (
    python_argv,
)
from loadtest.bench.http_clients.payloads import CHAT_PATH, JSON_HEADERS, MODULE, STREAM_MARK

# ------------------------------------------------------------------------------------------ the proxy


class Forwarder(Protocol):
    """What the proxy needs from an HTTP client library."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]: ...

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]: ...


class HttpxForwarder:
    """One shared httpx.AsyncClient, pool and keep-alive sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._client: Any = None

    async def start(self) -> None:
        import httpx

        limits = httpx.Limits(
            max_connections=self._connections,
            max_keepalive_connections=self._connections,
            keepalive_expiry=60.0,
        )
        self._client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0), trust_env=False)

    async def close(self) -> None:
        await self._client.aclose()

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        resp = await self._client.post(url, content=body, headers=JSON_HEADERS)
        return resp.status_code, resp.headers.get("content-type", "application/json"), resp.content

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        request = self._client.build_request("POST", url, content=body, headers=JSON_HEADERS)
        resp = await self._client.send(request, stream=True)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in resp.aiter_raw():
                    yield piece
            finally:
                await resp.aclose()

        return resp.status_code, resp.headers.get("content-type", "text/event-stream"), relay()


class AiohttpForwarder:
    """One shared aiohttp.ClientSession over a TCPConnector sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._session: Any = None

    async def start(self) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=self._connections, limit_per_host=self._connections, keepalive_timeout=60.0
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=30.0), trust_env=False
        )

    async def close(self) -> None:
        await self._session.close()

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        async with self._session.post(url, data=body, headers=JSON_HEADERS) as resp:
            data = await resp.read()
            return resp.status, resp.headers.get("Content-Type", "application/json"), data

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        resp = await self._session.post(url, data=body, headers=JSON_HEADERS)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for piece in resp.content.iter_any():
                    yield piece
            finally:
                resp.release()

        return resp.status, resp.headers.get("Content-Type", "text/event-stream"), relay()


class SwitchyardForwarder:
    """The gateway's own backend client (gateway/upstream/client.py), pool sized for ``connections``."""

    def __init__(self, connections: int) -> None:
        self._connections = connections
        self._client: Any = None

    async def start(self) -> None:
        from gateway.upstream.client import BackendClient

        self._client = BackendClient(limit_per_backend=self._connections, keepalive=60.0)

    async def close(self) -> None:
        self._client.close()

    def _split(self, url: str) -> tuple[str, str]:
        base, _, path = url.partition(CHAT_PATH)
        return base, CHAT_PATH + path

    async def fetch(self, url: str, body: bytes) -> tuple[int, str, bytes]:
        base, path = self._split(url)
        resp = await self._client.post(base, path, _SWITCHYARD_HEADERS, body, 30.0)
        data = await resp.read()
        resp.release()
        return resp.status, resp.header("content-type") or "application/json", data

    async def open_stream(self, url: str, body: bytes) -> tuple[int, str, AsyncIterator[bytes]]:
        base, path = self._split(url)
        resp = await self._client.post(base, path, _SWITCHYARD_HEADERS, body, 30.0)

        async def relay() -> AsyncIterator[bytes]:
            completed = False
            try:
                while piece := await resp.readany():
                    yield piece
                completed = True
            finally:
                resp.release() if completed else resp.close()

        return resp.status, resp.header("content-type") or "text/event-stream", relay()


_SWITCHYARD_HEADERS = b"Content-Type: application/json\r\n"


def make_forwarder(client: str, connections: int) -> Forwarder:
    if client == "httpx":
        return HttpxForwarder(connections)
    if client == "aiohttp":
        return AiohttpForwarder(connections)
    if client == "switchyard":
        return SwitchyardForwarder(connections)
    raise ValueError(f"unknown client {client!r}")


def create_app() -> Any:
    """Litestar app factory; configured by BENCH_CLIENT, BENCH_CONNECTIONS, BENCH_UPSTREAM_{JSON,STREAM}."""
    from litestar import Litestar, Request, Response, post
    from litestar.response import Stream

    # Under granian this runs in its worker, a child of the process the bench started (and stops with it
    # whatever ends the bench): the worker must not outlive that process.
    end_with_parent(signal.SIGKILL)

    forwarder = make_forwarder(os.environ["BENCH_CLIENT"], int(os.environ["BENCH_CONNECTIONS"]))
    json_url = os.environ["BENCH_UPSTREAM_JSON"] + CHAT_PATH
    stream_url = os.environ["BENCH_UPSTREAM_STREAM"] + CHAT_PATH

    names = {"Request": Request, "Response": Response, "Any": Any}

    @post(CHAT_PATH, status_code=200, signature_namespace=names)
    async def chat(request: Request[Any, Any, Any]) -> Response[Any]:
        body = await request.body()
        if STREAM_MARK in body:
            status, ctype, pieces = await forwarder.open_stream(stream_url, body)
            return Stream(pieces, status_code=status, media_type=ctype)
        status, ctype, data = await forwarder.fetch(json_url, body)
        return Response(data, status_code=status, media_type=ctype)

    return Litestar(
        route_handlers=[chat],
        on_startup=[forwarder.start],
        on_shutdown=[forwarder.close],
        openapi_config=None,
        logging_config=None,
    )


def serve_uvicorn(port: int) -> None:
    import uvicorn

    uvicorn.run(
        f"{MODULE}.proxy:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        workers=1,
        access_log=False,
        log_level="warning",
        lifespan="on",
    )


def proxy_argv(server: str, port: int) -> list[str]:
    if server == "uvicorn":
        return python_argv(MODULE, "_proxy", str(port))
    if server == "granian":
        return python_argv(
            "granian",
            *("--interface", "asgi", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            *("--runtime-mode", "st", "--loop", "uvloop", "--no-ws", "--no-access-log"),
            *("--log-level", "warning", "--factory", f"{MODULE}.proxy:create_app"),
        )
    raise ValueError(f"unknown server {server!r}")
