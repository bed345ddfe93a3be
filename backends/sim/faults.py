"""Fault injection for reliability tests: set at start (flags, fleet keys) or at run time over HTTP.

`GET /sim/faults` returns the current faults; `POST /sim/faults` with a JSON object changes the named
fields and leaves the others (`{"reset": true}` clears everything first). Every fault is reversible by
posting its off value. Faults apply to the generation and embedding endpoints only, so health checks,
`/metrics` and `/sim/faults` itself keep answering.

| field | off | effect |
|---|---|---|
| `error_rate` | 0 | this fraction of requests (0..1, seeded) is answered with `error_status` |
| `error_status` | 503 | the status of those answers, e.g. 429 (sent with `Retry-After: 1`), 500, 503 |
| `added_latency_ms` | 0 | simulated milliseconds added before a request reaches the engine |
| `hang` | false | requests are accepted and never answered (until the client gives up) |
| `die_after_tokens` | null | after this many tokens the connection is closed abruptly |
| `refuse_connections_s` | null | stop listening for this many seconds, then resume; `0` resumes now |

Times are simulated, like every other figure of the simulator.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

import msgspec

_Rate = Annotated[float, msgspec.Meta(ge=0, le=1)]
_Status = Annotated[int, msgspec.Meta(ge=400, le=599)]
_NonNegative = Annotated[float, msgspec.Meta(ge=0)]


class Faults(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The faults a backend injects; also the fleet file's `faults:` mapping."""

    error_rate: _Rate = 0.0
    error_status: _Status = 503
    added_latency_ms: _NonNegative = 0.0
    hang: bool = False
    die_after_tokens: Annotated[int, msgspec.Meta(ge=0)] | None = None
    refuse_connections_s: _NonNegative | None = None


class FaultUpdate(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A `POST /sim/faults` body: only the fields present change."""

    reset: bool = False
    error_rate: _Rate | msgspec.UnsetType = msgspec.UNSET
    error_status: _Status | msgspec.UnsetType = msgspec.UNSET
    added_latency_ms: _NonNegative | msgspec.UnsetType = msgspec.UNSET
    hang: bool | msgspec.UnsetType = msgspec.UNSET
    die_after_tokens: Annotated[int, msgspec.Meta(ge=0)] | msgspec.UnsetType | None = msgspec.UNSET
    refuse_connections_s: _NonNegative | msgspec.UnsetType | None = msgspec.UNSET


class Listener:
    """What `refuse_connections_s` needs from the server: stop and resume listening."""

    stop: Callable[[], Awaitable[None]]
    start: Callable[[], Awaitable[None]]

    def __init__(self, stop: Callable[[], Awaitable[None]], start: Callable[[], Awaitable[None]]) -> None:
        self.stop, self.start = stop, start


class FaultState:
    """The live faults of one server, with the refusal timer."""

    def __init__(self, faults: Faults, seed: int, sleep: Callable[[float], Awaitable[None]]) -> None:
        self.faults = faults
        self._rng = random.Random(seed)
        self._sleep = sleep
        self.listener: Listener | None = None
        self._refusal: asyncio.Task[None] | None = None
        self.refusing = False

    def draw_error(self) -> int | None:
        """The status to fail this request with, or None."""
        rate = self.faults.error_rate
        if rate > 0 and (rate >= 1 or self._rng.random() < rate):
            return self.faults.error_status
        return None

    def snapshot(self) -> dict[str, Any]:
        data = msgspec.to_builtins(self.faults)
        data["refusing_connections"] = self.refusing
        return data

    async def update(self, update: FaultUpdate) -> None:
        current = Faults() if update.reset else self.faults
        changes = {
            name: getattr(update, name)
            for name in Faults.__struct_fields__
            if getattr(update, name) is not msgspec.UNSET
        }
        self.faults = msgspec.structs.replace(current, **changes)
        if update.reset or "refuse_connections_s" in changes:
            await self.apply_refusal()

    async def apply_refusal(self) -> None:
        """(Re)start the refusal timer from `refuse_connections_s`; None or 0 resumes listening now."""
        if self._refusal is not None:
            self._refusal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refusal
            self._refusal = None
        seconds = self.faults.refuse_connections_s
        if self.listener is None:
            return
        if not seconds:
            await self._resume()
            return
        if not self.refusing:
            await self.listener.stop()
            self.refusing = True
        self._refusal = asyncio.get_running_loop().create_task(self._refuse_for(seconds))

    async def _refuse_for(self, seconds: float) -> None:
        await self._sleep(seconds)
        self.faults = msgspec.structs.replace(self.faults, refuse_connections_s=None)
        await self._resume()

    async def _resume(self) -> None:
        if self.refusing and self.listener is not None:
            await self.listener.start()
            self.refusing = False

    async def close(self) -> None:
        if self._refusal is not None:
            self._refusal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refusal
