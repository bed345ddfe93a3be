"""One step of the app's shutdown, bounded and named.

A step that hangs (a Redis close waiting on a cancelled read, a connection pool waiting on a peer) used to
hold the whole shutdown until the process was killed, silently, and skip every step after it: the ledger's
flush among them. Each step now has a time limit; one that runs over, or fails, is logged with what every
task was doing, and the shutdown goes on to the next.
"""

from __future__ import annotations

import asyncio
import io
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger("switchyard")

STEP_LIMIT_S = 10.0


async def stop_step(name: str, step: Coroutine[Any, Any, object], limit: float = STEP_LIMIT_S) -> None:
    # A task of its own, not asyncio.timeout: a step that swallows its cancellation would still hold on.
    task = asyncio.ensure_future(step)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        log.error(
            "shutdown: %s did not finish within %g s; going on without it. Where each task waits:\n%s",
            name,
            limit,
            task_stacks(),
        )
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return
    if task.cancelled():  # the step ended by a cancellation of its own (it awaited a cancelled task)
        log.error("shutdown: %s was cancelled; going on without it", name)
        return
    error = task.exception()
    if error is not None:
        log.error("shutdown: %s failed; going on without it", name, exc_info=error)


def task_stacks() -> str:
    """Where every task of the running loop is waiting, as asyncio prints it."""
    out = io.StringIO()
    current = asyncio.current_task()
    for task in asyncio.all_tasks():
        if task is not current:
            task.print_stack(limit=12, file=out)
    return out.getvalue()
