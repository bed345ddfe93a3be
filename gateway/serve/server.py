"""Run the gateway app under uvicorn (uvloop + httptools, no access log: the hot path logs nothing).

The HTTP protocol is uvicorn's httptools one with the connection limits of `gateway.connections`
(gateway/http/limits.py); no websocket protocol is loaded, so an `Upgrade` request is served as HTTP.
With `gateway.admin_port` the one app listens on two sockets and tells them apart by the local port
(gateway/admin/port.py): the admin API only on the admin port, the OpenAI API only on the other.
"""

from __future__ import annotations

import socket
from typing import Any

import uvicorn

from gateway.app import asgi_entry, create_app
from gateway.config.settings import Settings
from gateway.http.limits import protocol_class
from gateway.serve.handoff import HandoffServer
from gateway.serve.watched import WatchedServer


def server_config(
    settings: Settings, host: str, port: int, log_level: str = "info", app: Any = None
) -> uvicorn.Config:
    """uvicorn's settings for the gateway; `app` is the ASGI entry (by default built from `settings`)."""
    options = settings.server
    limits = options.connections
    protocol = protocol_class(limits, options.trusted_proxies, options.proxy_protocol, options.forwarded_for)
    return uvicorn.Config(
        app if app is not None else asgi_entry(create_app(settings)),
        host=host,
        port=port,
        loop="uvloop",
        http=protocol,
        interface="asgi3",  # said, not guessed: FastPath's `__call__` returns its handler's coroutine
        ws="none",
        # uvicorn annotates it int but hands it to loop.call_later, which takes fractions of a second
        timeout_keep_alive=limits.keep_alive_timeout,  # type: ignore[arg-type]
        access_log=False,
        proxy_headers=False,
        server_header=False,
        log_level=log_level,
        lifespan="on",
        timeout_graceful_shutdown=max(1, round(settings.server.shutdown_grace)),
    )


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048, reuse_port=reuse_port)


def run_server(
    settings: Settings,
    host: str,
    port: int,
    log_level: str = "info",
    channel: socket.socket | None = None,
    main_socket: socket.socket | None = None,
) -> None:
    """Serve on `host:port` and the admin port if set. A worker (gateway/serve/workers.py) has a `channel` to
    its supervisor and serves the connections it hands over, or listens on `main_socket` (SO_REUSEPORT)."""
    admin_port = settings.server.admin_port
    if admin_port is None and channel is None:
        WatchedServer(server_config(settings, host, port, log_level)).run()
        return
    if main_socket is not None:
        sockets = [main_socket]
    else:
        sockets = [] if channel is not None else [listening_socket(host, port)]
    app = None
    if admin_port is not None:
        admin = listening_socket(host, admin_port, reuse_port=channel is not None)
        sockets.append(admin)
        app = asgi_entry(create_app(settings), admin_port=admin.getsockname()[1])
    config = server_config(settings, host, port, log_level, app)
    server = WatchedServer(config) if channel is None else HandoffServer(config, channel)
    server.run(sockets=sockets)
