"""A worker's side of the connection hand-off (gateway/serve/workers.py): connections arrive as file
descriptors over a Unix socketpair with the supervisor, and each close goes back as one byte.

The channel is SOCK_SEQPACKET, so every message keeps its boundary: from the supervisor, one byte with one
accepted connection's fd (SCM_RIGHTS); from the worker, `R` once it serves (after the app's startup) and
one `.` per handed connection closed, which keeps the supervisor's per-worker counts live.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any

import uvicorn

from gateway.serve.watched import WatchedServer

log = logging.getLogger("switchyard.workers")

READY = b"R"
CLOSED = b"."
CONNECTION = b"c"


class HandoffServer(WatchedServer):
    """uvicorn's Server serving the connections the supervisor hands over (plus any listening `sockets`,
    the admin port's) with the protocol its own listeners use."""

    def __init__(self, config: uvicorn.Config, channel: socket.socket) -> None:
        super().__init__(config)
        self._channel = channel
        self._unreported = 0
        self._flushing = False
        self._adopting: set[asyncio.Task[None]] = set()
        self._reading = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        base = self.config.http_protocol_class
        # The admin listener builds the same class, so one sweeper serves both; only handed ones report.
        self.config.http_protocol_class = _reporting(base, self._closed)
        await super().startup(sockets=sockets or [])
        self._channel.setblocking(False)
        asyncio.get_running_loop().add_reader(self._channel.fileno(), self._receive)
        self._reading = True
        self._send(READY)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._stop_reading()  # stop taking connections; the supervisor has stopped accepting
        await super().shutdown(sockets)

    def _stop_reading(self) -> None:
        if self._reading:
            asyncio.get_running_loop().remove_reader(self._channel.fileno())
            self._reading = False

    def _protocol(self) -> asyncio.Protocol:
        protocol = self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state, app_state=self.lifespan.state
        )
        protocol._handed_over = True  # type: ignore[attr-defined]
        return protocol

    def _receive(self) -> None:
        while True:
            try:
                message, fds, _flags, _addr = socket.recv_fds(self._channel, 16, 16)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                message, fds = b"", []
                log.warning("switchyard: hand-off channel failed: %s", exc)
            if not message and not fds:  # the supervisor is gone
                self._stop_reading()
                self.should_exit = True
                return
            for fd in fds:
                task = asyncio.get_running_loop().create_task(self._adopt(socket.socket(fileno=fd)))
                self._adopting.add(task)
                task.add_done_callback(self._adopting.discard)

    async def _adopt(self, sock: socket.socket) -> None:
        try:
            await asyncio.get_running_loop().connect_accepted_socket(self._protocol, sock)
        except OSError:
            sock.close()
            self._closed()  # never served: connection_lost will not report it

    def _closed(self) -> None:
        self._unreported += 1
        if self._unreported == 1 and not self._flushing:  # one message for the closes of a loop iteration
            asyncio.get_running_loop().call_soon(self._flush)

    def _send(self, message: bytes) -> None:
        with contextlib.suppress(OSError):  # the supervisor is gone; PR_SET_PDEATHSIG ends this worker
            self._channel.send(message)

    def _flush(self) -> None:
        while self._unreported:
            count = min(self._unreported, 4096)
            try:
                self._channel.send(CLOSED * count)
            except (BlockingIOError, InterruptedError):
                if not self._flushing:  # retried when the supervisor has read
                    self._flushing = True
                    asyncio.get_running_loop().add_writer(self._channel.fileno(), self._writable)
                return
            except OSError:
                self._unreported = 0
                return
            self._unreported -= count

    def _writable(self) -> None:
        asyncio.get_running_loop().remove_writer(self._channel.fileno())
        self._flushing = False
        self._flush()


def _reporting(base: type[asyncio.Protocol], on_close: Any) -> type[asyncio.Protocol]:
    class Reporting(base):  # type: ignore[valid-type,misc]
        _handed_over = False

        def connection_lost(self, exc: Exception | None) -> None:
            try:
                super().connection_lost(exc)
            finally:
                if self._handed_over:
                    on_close()

    Reporting.__name__ = Reporting.__qualname__ = f"Handed{base.__name__}"
    return Reporting
