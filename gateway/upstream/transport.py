"""The one seam between the request path and the network: a `Transport` sends a request to a backend.

The gateway's transport is `BackendClient` (gateway/upstream/client.py, pooled HTTP/1.1 sockets);
tests give `Upstream` an in-memory one instead (tests/memory_transport.py), as httpx's transports allow.
Failures are raised as `UpstreamError` subclasses (gateway/upstream/connection.py) by either.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol


class BackendResponse(Protocol):
    """A backend's answer: status and headers arrived, the body is read on demand."""

    status: int
    closed: bool
    """The connection was dropped rather than kept for another request."""

    def header(self, name: str) -> str | None:
        """The value of header `name` (lower case); the last one when it repeats."""
        ...

    @property
    def content_type(self) -> str:
        """The media type without parameters (`text/event-stream`)."""
        ...

    def read(self) -> Awaitable[bytes]:
        """The whole body."""
        ...

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end."""
        ...

    def all_read(self) -> bool:
        """The whole answer has arrived and been read: `readany` would return b"" at once."""
        ...

    def take_buffered(self) -> bytes:
        """What arrived and was not read yet, without waiting."""
        ...

    def half_close(self) -> bool:
        """Tell the backend we are gone but keep reading what it already sent; False if impossible."""
        ...

    def release(self) -> None:
        """Done with a fully read answer (its connection may carry another request)."""
        ...

    def close(self) -> None:
        """Abandon the answer: the backend stops working on it."""
        ...


class Transport(Protocol):
    async def send(
        self, base_url: str, path: str, headers: bytes, body: bytes, connect_timeout: float
    ) -> BackendResponse:
        """POST `body` to `base_url` + `path` (`headers`: ready-made `Name: value\\r\\n` lines) and return
        once the answer's status and headers are in."""
        ...

    def close(self) -> None: ...
