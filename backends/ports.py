"""A port picked for a server that another process will start, held until that process is done with it.

Picking a port by binding to port 0 and closing the socket (the usual `free_port()`) frees it again at
once: until the server binds it, seconds later, any other process's `bind(port 0)` may be handed the same
port, and a server of its own then listens there. A server that cannot bind exits; whoever waits for it
by probing the port may get an answer from the other process instead, and goes on with the wrong server.

`reserve_port()` keeps the socket, bound but not listening, with SO_REUSEADDR. Under Linux's rules that
keeps the port from `bind(port 0)` in every other process and from outgoing connections' automatic ports,
while a server that sets SO_REUSEADDR itself (uvicorn, redis-server, HAProxy all do) still binds and
listens on it. A connection to the port is refused as before until a server listens there.
"""

from __future__ import annotations

import socket


def reserve_port(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A socket holding `host:port` (port 0: a free one, read it with `getsockname()`); close it when the
    server it was picked for no longer needs the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def port_of(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
