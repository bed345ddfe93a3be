"""Run the gateway app under uvicorn (uvloop + httptools, no access log: the hot path logs nothing).

The HTTP protocol is uvicorn's httptools one with the connection limits of `gateway.connections`
(gateway/http_limits.py); no websocket protocol is loaded, so an `Upgrade` request is served as HTTP.
"""

from __future__ import annotations

from typing import Any

import uvicorn

from gateway.app import asgi_entry, create_app
from gateway.http_limits import protocol_class
from gateway.settings import Settings


def server_config(
    settings: Settings, host: str, port: int, log_level: str = "info", app: Any = None
) -> uvicorn.Config:
    """uvicorn's settings for the gateway; `app` is the ASGI entry (by default built from `settings`)."""
    limits = settings.server.connections
    return uvicorn.Config(
        app if app is not None else asgi_entry(create_app(settings)),
        host=host,
        port=port,
        loop="uvloop",
        http=protocol_class(limits),
        ws="none",
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.server.shutdown_grace)),
    )


def run_server(settings: Settings, host: str, port: int, log_level: str = "info") -> None:
    uvicorn.Server(server_config(settings, host, port, log_level)).run()
