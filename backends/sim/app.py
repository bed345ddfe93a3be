"""Serve a simulated backend: its aiohttp routes, and starting and stopping it on a socket."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from backends.sim.faults import Listener
from backends.sim.metrics import EngineStats
from backends.sim.options import SimOptions
from backends.sim.server import SimServer

log = logging.getLogger("backends.sim")

STATS_KEY = web.AppKey("stats", EngineStats)


SERVER_KEY: web.AppKey[SimServer] = web.AppKey("server")


def create_app(options: SimOptions) -> web.Application:
    server = SimServer(options)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[STATS_KEY] = server.stats
    app[SERVER_KEY] = server
    app.on_cleanup.append(server.close)
    app.router.add_get("/sim/faults", server.get_faults)
    app.router.add_post("/sim/faults", server.post_faults)
    app.router.add_get("/sim/info", server.info)
    app.router.add_get("/health", server.health)
    app.router.add_get("/version", server.version)
    app.router.add_get("/metrics", server.metrics)
    app.router.add_get("/v1/models", server.models)
    app.router.add_post("/v1/chat/completions", server.chat)
    app.router.add_post("/v1/completions", server.completions)
    app.router.add_post("/v1/embeddings", server.embeddings)
    app.router.add_post("/v1/responses", server.responses)
    app.router.add_get("/v1/responses/{response_id}", server.get_response)
    app.router.add_post("/v1/messages", server.messages)
    return app


LISTEN_BACKLOG = 2048
"""Connections the kernel queues before they are accepted: vLLM's (uvicorn's default), not aiohttp's 128,
which a burst of new streams from the gateway overflows (the kernel then drops SYNs and the client sees
connection errors the real server would not cause)."""


@dataclass(slots=True)
class RunningServer:
    """A simulator listening on a socket; `close()` stops it."""

    runner: web.AppRunner
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def stats(self) -> EngineStats:
        return self.runner.app[STATS_KEY]

    @property
    def sim(self) -> SimServer:
        return self.runner.app[SERVER_KEY]

    async def close(self) -> None:
        await self.runner.cleanup()


async def start_server(
    options: SimOptions, host: str = "127.0.0.1", port: int = 0, *, handler_cancellation: bool = True
) -> RunningServer:
    """Serve `create_app(options)` on host:port (0 picks a free port).

    handler_cancellation makes aiohttp cancel a handler whose client disconnected, so an abandoned
    request stops at once instead of at its next write (which also aborts it, just later).
    """
    access_log = log if log.isEnabledFor(logging.DEBUG) else None
    runner = web.AppRunner(
        create_app(options), handler_cancellation=handler_cancellation, access_log=access_log
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=LISTEN_BACKLOG)
    await site.start()
    bound = runner.addresses[0][1]
    sites = [site]

    async def stop_listening() -> None:
        await sites.pop().stop()

    async def start_listening() -> None:
        again = web.TCPSite(runner, host, bound, backlog=LISTEN_BACKLOG)
        await again.start()
        sites.append(again)

    sim = runner.app[SERVER_KEY]
    sim.faults.listener = Listener(stop=stop_listening, start=start_listening)
    if sim.faults.faults.refuse_connections_s:
        await sim.faults.apply_refusal()
    return RunningServer(runner=runner, host=host, port=bound)
