"""A uvicorn Server that says where it is stuck when it does not stop.

uvicorn bounds the drain by `gateway.shutdown_grace`, but nothing bounds what runs after it: the app's
shutdown, the cancelled tasks asyncio waits for, the default executor's threads. A gateway stuck there is
killed by its supervisor (Kubernetes, systemd, a test) without a word. Once the drain starts, this arms
Python's faulthandler: if the process is still alive `STUCK_AFTER_S` seconds past the grace period, every
thread's stack goes to stderr, which is the replica's log.
"""

from __future__ import annotations

import faulthandler
import socket
import sys

import uvicorn

STUCK_AFTER_S = 10.0


class WatchedServer(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        grace = self.config.timeout_graceful_shutdown or 0
        faulthandler.dump_traceback_later(grace + STUCK_AFTER_S, file=sys.stderr)
        await super().shutdown(sockets)
