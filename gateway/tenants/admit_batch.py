"""Admissions that arrive in the same turn of the event loop go to Redis as one `limits.ADMIT` call.

Each request still waits for exactly one round trip (the one its batch makes), but the client library's
cost per call (encoding the command, parsing the answer, a pooled connection, a task) is paid once per
batch instead of once per request: under load that cost was most of what keys and limits added.
"""

from __future__ import annotations

import asyncio
from typing import Any

_MAX_BATCH = 256


class AdmitBatcher:
    def __init__(self, script: Any, window_ms: int, replica: str, namespace: str) -> None:
        self._script = script
        self._head: list[int | str] = [window_ms, replica, namespace]
        self._args: list[int | str] = []
        self._waiting: list[asyncio.Future[bytes]] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def admit(self, tokens: int, cost: int, scope_args: list[str]) -> asyncio.Future[bytes]:
        """The request's answer from `limits.ADMIT` (bytes), or the batch's exception."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        if not self._waiting:
            loop.call_soon(self._send)
        self._args += [len(scope_args), tokens, cost, *scope_args]
        self._waiting.append(future)
        if len(self._waiting) >= _MAX_BATCH:
            self._send()
        return future

    def _send(self) -> None:
        if not self._waiting:
            return
        args, waiting = self._args, self._waiting
        self._args, self._waiting = [], []
        task = asyncio.get_running_loop().create_task(self._call(self._head + args, waiting))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, args: list[int | str], waiting: list[asyncio.Future[bytes]]) -> None:
        try:
            replies = await self._script(args=args)
        except Exception as exc:
            for future in waiting:
                if not future.done():
                    future.set_exception(exc)
            return
        for future, reply in zip(waiting, replies, strict=True):
            if not future.done():
                future.set_result(reply)
