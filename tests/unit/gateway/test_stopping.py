"""A shutdown step that hangs or fails is named in the log and the steps after it still run; a gateway
process stuck after its drain writes every thread's stack to stderr."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from gateway.stopping import stop_step


async def _hang_on_a_lock(lock: asyncio.Lock) -> None:
    async with lock:
        pass


def _then_the_ledger(name: str, step: Coroutine[Any, Any, object]) -> bool:
    """Stop `step` as `name`, then a ledger step; whether the ledger step ran."""
    ran: list[str] = []

    async def flush() -> None:
        ran.append("flush")

    async def main() -> None:
        await stop_step(name, step)
        await stop_step("the ledger", flush())

    asyncio.run(main())
    return ran == ["flush"]


async def _swallow_cancellation() -> None:
    """Ignores being cancelled for 1.5 s, then ends."""
    until = time.monotonic() + 1.5
    while time.monotonic() < until:
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(0.05)


def test_a_step_that_hangs_is_cut_off_named_and_the_next_step_runs(caplog: pytest.LogCaptureFixture) -> None:
    ran: list[str] = []

    async def flush() -> None:
        ran.append("flush")

    async def main() -> float:
        lock = asyncio.Lock()
        # a step that swallows its cancellation is left behind all the same
        swallowing = stop_step("the batch runner", _swallow_cancellation(), limit=0.1)
        await lock.acquire()  # held for good: the step below waits forever
        started = time.monotonic()
        await swallowing
        await stop_step("the fleet view", _hang_on_a_lock(lock), limit=0.2)
        await stop_step("the ledger", flush())
        return time.monotonic() - started

    with caplog.at_level(logging.ERROR, logger="switchyard"):
        took = asyncio.run(main())
    assert took < 2.0
    assert ran == ["flush"]
    assert "the batch runner did not finish" in caplog.records[0].getMessage()
    message = caplog.records[1].getMessage()
    assert "shutdown: the fleet view did not finish within 0.2 s; going on without it" in message
    assert "in _hang_on_a_lock" in message  # where the step itself waits


def test_the_log_shows_where_other_tasks_wait(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        lock = asyncio.Lock()
        await lock.acquire()
        task = asyncio.create_task(_hang_on_a_lock(lock))
        await asyncio.sleep(0)
        await stop_step("the health checker", asyncio.sleep(5), limit=0.1)
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="switchyard"):
        asyncio.run(main())
    assert "in _hang_on_a_lock" in caplog.records[0].getMessage()


def test_a_step_that_fails_is_logged_and_the_next_step_runs(caplog: pytest.LogCaptureFixture) -> None:
    async def broken() -> None:
        raise ConnectionResetError("peer went away")

    with caplog.at_level(logging.ERROR, logger="switchyard"):
        assert _then_the_ledger("the upstream pool", broken())
    assert "shutdown: the upstream pool failed" in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is not None


def test_a_step_that_ends_cancelled_does_not_end_the_shutdown(caplog: pytest.LogCaptureFixture) -> None:
    async def awaits_a_cancelled_task() -> None:
        task = asyncio.create_task(asyncio.sleep(5))
        await asyncio.sleep(0)
        task.cancel()
        await task

    with caplog.at_level(logging.ERROR, logger="switchyard"):
        assert _then_the_ledger("the scraper", awaits_a_cancelled_task())
    assert "shutdown: the scraper was cancelled" in caplog.records[0].getMessage()


STUCK_SERVER = textwrap.dedent(
    """
    import socket, sys, time
    import uvicorn
    from gateway.serve import watched

    watched.STUCK_AFTER_S = 0.5

    def stuck_in_shutdown_forever():
        time.sleep(30)

    async def app(scope, receive, send):
        assert scope["type"] == "lifespan"
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
                print("up", flush=True)
            elif message["type"] == "lifespan.shutdown":
                stuck_in_shutdown_forever()
                await send({"type": "lifespan.shutdown.complete"})
                return

    sock = socket.create_server(("127.0.0.1", 0))
    config = uvicorn.Config(app, lifespan="on", timeout_graceful_shutdown=1, log_level="warning")
    watched.WatchedServer(config).run(sockets=[sock])
    """
)


def test_a_server_stuck_after_its_drain_writes_where_it_is_stuck() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", STUCK_SERVER],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "up"
        process.send_signal(signal.SIGTERM)
        time.sleep(3.0)  # grace 1 s + 0.5 s, then the dump
    finally:
        process.kill()
        _, stderr = process.communicate(timeout=10)
    assert "Timeout (0:00:01.500000)!" in stderr, stderr
    assert "stuck_in_shutdown_forever" in stderr, stderr
