"""What a backend receives besides the client's body: its auth header and the headers passed on.

Per backend, the constant lines (content type, `Authorization: Bearer <api_key>`) are encoded once; per
request only the passed-on headers (request id, trace context) are added.
"""

from __future__ import annotations

from backends.models import Backend


class BackendHeaders:
    """The header lines of requests to each backend (Host and Content-Length are the transport's)."""

    __slots__ = ("_base",)

    def __init__(self) -> None:
        self._base: dict[str, bytes] = {}

    def lines(self, backend: Backend, forwarded: dict[str, str]) -> bytes:
        base = self._base.get(backend.name)
        if base is None:
            text = "Content-Type: application/json\r\n"
            if backend.api_key:
                text += f"Authorization: Bearer {backend.api_key}\r\n"
            base = self._base[backend.name] = text.encode("latin-1")
        if not forwarded:
            return base
        return base + "".join([f"{k}: {v}\r\n" for k, v in forwarded.items()]).encode("latin-1")


def auth_header(backend: Backend) -> dict[str, str] | None:
    """The backend's auth as a header dict, for the calls off the request path (aiohttp)."""
    return {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else None
