"""`gateway.admin_port`: the admin API on its own port, so a deployment exposes only the API.

One process, one app, two listening sockets (gateway/serve/server.py); this entry point tells the two apart by
the local port the connection arrived on (`scope["server"]`, the socket's own address, never a header):

    public port: `/v1/...`, `/health`, `/ready`, `/metrics`;  `/admin/...` and `/console...` answer 404
    admin port:  `/admin/...`, `/console...`, `/health`, `/ready`, `/metrics`;  `/v1/...` answers 404

It replaces `FastPath` (same dispatch of the forwarding routes, one comparison more), so the hot path gets
no extra coroutine layer.
"""

from __future__ import annotations

import os
from typing import Any

from gateway.http.asgi_io import send_error
from gateway.http.fastpath import AsgiHandler
from gateway.openai.errors import GatewayError

ADMIN_PATHS = ("/admin/", "/console")
ON_ADMIN_PORT = "switchyard.admin_port"
"""Set (True) in the scope of a request that came in on the admin port."""
BOTH_PATHS = frozenset({"/health", "/ready", "/metrics"})


def _request_id() -> str:
    return "req-" + os.urandom(12).hex()


def _unknown(path: str) -> GatewayError:
    return GatewayError(404, f"Unknown path `{path}`.", "invalid_request_error")


class AdminPortSplit:
    __slots__ = ("_app", "_routes", "admin_port")

    def __init__(self, app: AsgiHandler, routes: dict[str, AsgiHandler], admin_port: int) -> None:
        self._app = app
        self._routes = routes
        self.admin_port = admin_port

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            path: str = scope["path"]
            server = scope.get("server")
            on_admin = server is not None and server[1] == self.admin_port
            if on_admin:
                if not path.startswith(ADMIN_PATHS) and path not in BOTH_PATHS:
                    await send_error(send, _unknown(path), _request_id())
                    return
                scope[ON_ADMIN_PORT] = True
            else:
                handler = self._routes.get(path)
                if handler is not None:
                    await handler(scope, receive, send)
                    return
                if path.startswith(ADMIN_PATHS):
                    await send_error(send, _unknown(path), _request_id())
                    return
        await self._app(scope, receive, send)
