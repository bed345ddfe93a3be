"""An in-memory `Transport` (gateway/upstream/transport.py): backends answer from a script, no sockets.

Each backend URL has a list of answers, used one per request (the last one repeats). An answer is a
`Scripted` reply, or an `UpstreamError` class raised instead of answering (`ConnectFailed`: refused).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from gateway.upstream.connection import ConnectionBroken, UpstreamError

SSE = {"content-type": "text/event-stream"}
JSON = {"content-type": "application/json"}


@dataclass
class Scripted:
    status: int = 200
    headers: dict[str, str] = field(default_factory=lambda: dict(JSON))
    chunks: list[bytes] = field(default_factory=lambda: [b"{}"])
    cut: bool = False
    """After the chunks the connection breaks instead of ending."""
    delay: float = 0.0
    """Seconds before the headers arrive."""


class MemoryResponse:
    def __init__(self, scripted: Scripted) -> None:
        self.status = scripted.status
        self.headers = scripted.headers
        self._chunks = list(scripted.chunks)
        self._cut = scripted.cut
        self.closed = False
        self.released = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name)

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "application/octet-stream").partition(";")[0].strip()

    async def read(self) -> bytes:
        parts = []
        while data := await self.readany():
            parts.append(data)
        return b"".join(parts)

    async def readany(self) -> bytes:
        await asyncio.sleep(0)
        if self.closed:
            raise ConnectionBroken("closed")
        if self._chunks:
            return self._chunks.pop(0)
        if self._cut:
            raise ConnectionBroken("the backend closed the connection")
        return b""

    def all_read(self) -> bool:
        return not self._chunks and not self._cut and not self.closed

    def take_buffered(self) -> bytes:
        return b""

    def half_close(self) -> bool:
        return False

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


class MemoryTransport:
    def __init__(self, answers: dict[str, list[Scripted | type[UpstreamError]]]) -> None:
        self.answers = answers
        self.sent: list[tuple[str, str, bytes, bytes]] = []
        self.responses: list[MemoryResponse] = []
        self.closed = False

    async def send(
        self, base_url: str, path: str, headers: bytes, body: bytes, connect_timeout: float
    ) -> MemoryResponse:
        self.sent.append((base_url, path, headers, body))
        script = self.answers[base_url]
        answer = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(answer, type):
            raise answer(f"scripted {answer.__name__}")
        if answer.delay:
            await asyncio.sleep(answer.delay)
        response = MemoryResponse(answer)
        self.responses.append(response)
        return response

    def close(self) -> None:
        self.closed = True

    def urls(self) -> list[str]:
        return [url for url, *_ in self.sent]
