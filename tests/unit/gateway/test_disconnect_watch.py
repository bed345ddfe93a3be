"""`DisconnectWatch`: a lost connection cancels the request it carried, through the gateway's protocol's
hook (no task per request) and, under another server, through `receive()`."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.http.asgi_io import DisconnectWatch
from tests.unit.gateway.test_http_limits import REQUEST, _connect


class _App:
    """Reads the body, watches, then waits for an answer that never comes (a slow backend)."""

    def __init__(self) -> None:
        self.watch: DisconnectWatch | None = None
        self.cancelled = asyncio.Event()
        self.tasks_at_watch = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        before = len(asyncio.all_tasks())
        self.watch = watch = DisconnectWatch(receive)
        self.tasks_at_watch = len(asyncio.all_tasks()) - before
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            if watch.swallow():
                self.cancelled.set()
                return
            raise
        finally:
            watch.stop()


async def test_the_gateways_protocol_cancels_the_request_when_its_client_goes() -> None:
    app = _App()
    protocol, _ = _connect(app)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.01)
    assert app.watch is not None
    assert app.tasks_at_watch == 0  # the protocol's hook: no watcher task
    protocol.connection_lost(None)
    await asyncio.wait_for(app.cancelled.wait(), 1)
    assert app.watch.gone


async def test_a_connection_lost_after_stop_cancels_nothing() -> None:
    app = _App()
    protocol, _ = _connect(app)
    protocol.data_received(REQUEST)
    await asyncio.sleep(0.01)
    assert app.watch is not None
    app.watch.stop()
    protocol.connection_lost(None)
    await asyncio.sleep(0.01)
    assert not app.watch.gone and not app.cancelled.is_set()
    for task in protocol.tasks:
        task.cancel()


async def test_a_client_gone_before_the_watch_starts_cancels_at_the_next_wait() -> None:
    app = _App()

    async def gone_first(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        protocol.connection_lost(None)  # the client left while the request was being read
        await app(scope, _Replay(receive), send)

    protocol, _ = _connect(gone_first)
    protocol.data_received(REQUEST)
    await asyncio.wait_for(app.cancelled.wait(), 1)


class _Replay:
    """`receive` of the same cycle, its body already read (so the app's own read returns at once)."""

    def __init__(self, receive: Any) -> None:
        self.__self__ = receive.__self__

    async def __call__(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}


async def test_under_another_server_a_disconnect_message_cancels_the_request() -> None:
    disconnected = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def request() -> bool:
        watch = DisconnectWatch(receive)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return watch.swallow()
        finally:
            watch.stop()
        return False

    task = asyncio.create_task(request())
    await asyncio.sleep(0.01)
    disconnected.set()
    assert await asyncio.wait_for(task, 1)
