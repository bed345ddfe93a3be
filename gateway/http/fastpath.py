"""The ASGI entry point in front of the Litestar app: the `/v1` forwarding endpoints go straight to their
handlers, everything else (admin, health, metrics, lifespan) to Litestar.

The forwarding handlers are Litestar ASGI route handlers already (gateway/http/routes.py); this only skips
Litestar's per-request dispatch (middleware stack, router lookup, scope copy) for them, which measured
about a tenth of the gateway's CPU per request on one core (docs/internals.md, design notes).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

AsgiHandler = Callable[[Any, Any, Any], Awaitable[None]]


class FastPath:
    __slots__ = ("_app", "_routes")

    def __init__(self, app: AsgiHandler, routes: dict[str, AsgiHandler]) -> None:
        self._app = app
        self._routes = routes

    def __call__(self, scope: Any, receive: Any, send: Any) -> Awaitable[None]:
        """The handler's own coroutine, not one wrapping it: a layer less on every resumption of the task."""
        if scope["type"] == "http":
            handler = self._routes.get(scope["path"])
            if handler is not None:
                return handler(scope, receive, send)
        return self._app(scope, receive, send)
