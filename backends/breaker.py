"""Whether a backend may get traffic: its circuit breaker, plus the other reasons routing skips it.

    closed ──(failure_threshold failures in a row, or one refused connection)──▶ open
    open ──(open_s later, once the health check passes)──▶ half-open
    half-open ──(close_after successes)──▶ closed
    half-open ──(any failure)──▶ open (again for open_s)

Failures are what the request path sees and attributes to the backend (gateway/request/attribution.py):
refused or broken connections; 5xx answers and timeouts of requests another backend then served. A 5xx
or timeout that no second backend could check (`suspect`) counts too, but the failure that would open
the breaker first asks the backend's health check (`confirm`, set by backends/health.py): a backend whose
`/health` answers while it fails one client's requests is not sick, so its count starts again. Active
health checks set `Backend.health_ok` on their own thresholds. Routing reads one
flag, `Backend.healthy`, which `Breaker.refresh` keeps equal to: health check passing, breaker not open,
not draining, and no `Retry-After` pause in force. It changes only on these events, never per request.

A half-open backend is routable again, but only `half_open_probes` requests at a time may be sent to it
(`allow`); the request path checks this only when the state is not closed, so a healthy fleet pays one
attribute comparison per attempt.

An open breaker does not half-open on the clock alone when the health check is there (`confirm`): after
`open_s` it asks for one check (a fresh connection, backends/health.py) and half-opens only if it
passes, else stays open another `open_s`. A backend that refuses new connections would otherwise flap
open → half-open (routable, counted as serving by `/ready`) → open every `open_s`, each probe a
client's failed request.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, Protocol

import msgspec

log = logging.getLogger("switchyard.breaker")

CLOSED: Literal["closed"] = "closed"
OPEN: Literal["open"] = "open"
HALF_OPEN: Literal["half-open"] = "half-open"
State = Literal["closed", "open", "half-open"]


class BreakerOptions(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """`gateway.breaker` in the config file."""

    failure_threshold: Annotated[int, msgspec.Meta(ge=1)] = 5
    """Consecutive failed requests (5xx, timeout, broken connection) that open the breaker."""
    open_s: Annotated[float, msgspec.Meta(gt=0)] = 5.0
    """How long an open breaker keeps the backend out before letting probes through."""
    half_open_probes: Annotated[int, msgspec.Meta(ge=1)] = 1
    """Requests allowed at once to a half-open backend."""
    close_after: Annotated[int, msgspec.Meta(ge=1)] = 2
    """Successful probes that close the breaker again."""
    max_retry_after_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """A backend's `Retry-After` longer than this is cut to it."""


class Guarded(Protocol):
    """What the breaker reads and sets on its backend (backends.models.Backend)."""

    name: str
    health_ok: bool
    draining: bool
    healthy: bool


class Breaker:
    __slots__ = (
        "_backend",
        "_confirming",
        "_timer",
        "_unpause",
        "confirm",
        "failures",
        "health_failing_since",
        "opened",
        "opened_at",
        "options",
        "paused_until",
        "probes",
        "reason",
        "state",
        "successes",
    )

    def __init__(self, backend: Guarded, options: BreakerOptions | None = None) -> None:
        self._backend = backend
        self.options = options or BreakerOptions()
        self.state: State = CLOSED
        self.failures = 0
        self.successes = 0
        self.probes = 0
        self.opened = 0
        """How many times the breaker has opened (for the admin listing)."""
        self.opened_at: float | None = None
        """Wall time (time.time()) it last opened; None if it never has."""
        self.reason = ""
        """Why it last opened (the failure that opened it), for the admin listing."""
        self.health_failing_since: float | None = None
        """Wall time the backend's health check started failing (`health_ok` went False); None while it
        passes. Kept by `refresh`, which backends/health.py calls on every change of `health_ok`."""
        self.paused_until = 0.0
        """time.monotonic() until which the backend asked not to be sent anything (`Retry-After`)."""
        self._timer: asyncio.TimerHandle | None = None
        self._unpause: asyncio.TimerHandle | None = None
        self.confirm: Callable[[], Awaitable[bool]] | None = None
        """Asks the backend's health check now (True: it passes); set by backends/health.py."""
        self._confirming: asyncio.Task[None] | None = None

    # --- what the request path calls ------------------------------------------------------------------

    def allow(self) -> bool:
        """Whether a request may go to the backend now; call only when `state is not CLOSED`."""
        if self.state is HALF_OPEN and self.probes < self.options.half_open_probes:
            self.probes += 1
            return True
        return self.state is CLOSED

    def success(self) -> None:
        if self.state is CLOSED:
            self.failures = 0
            return
        if self.probes:
            self.probes -= 1
        if self.state is HALF_OPEN:
            self.successes += 1
            if self.successes >= self.options.close_after:
                self._set(CLOSED)

    def failure(self, why: str, at_once: bool = False) -> None:
        """A failed request; `at_once` (a refused connection: nothing listens) opens without counting."""
        if self.probes:
            self.probes -= 1
        if self.state is OPEN:
            return
        self.failures += 1
        if at_once or self.state is HALF_OPEN or self.failures >= self.options.failure_threshold:
            log.warning("backend %s: circuit opened (%s)", self._backend.name, why)
            self.reason = why
            self._set(OPEN)

    def suspect(self, why: str) -> None:
        """A 5xx or timeout no other backend could check (the request had nowhere else to go): counted
        as a failure, except the one that would open a closed breaker, which asks `confirm` first."""
        confirm = self.confirm
        if confirm is None or self.state is not CLOSED or self.failures + 1 < self.options.failure_threshold:
            self.failure(why)
            return
        if self.probes:
            self.probes -= 1
        if self._confirming is None:
            self._confirming = _loop().create_task(self._confirm(confirm, why))

    async def _confirm(self, confirm: Callable[[], Awaitable[bool]], why: str) -> None:
        try:
            passes = await confirm()
        finally:
            self._confirming = None
        if self.state is not CLOSED:
            return
        if passes:
            log.info("backend %s: %s, but its health check passes: not counted", self._backend.name, why)
            self.failures = 0
        else:
            self.failure(f"{why}, and its health check fails", at_once=True)

    def release(self) -> None:
        """A request ended with no verdict on the backend (the client left, a 4xx); frees a probe."""
        if self.probes:
            self.probes -= 1

    def pause(self, seconds: float) -> None:
        """Honour a backend's `Retry-After`: no new requests until then."""
        seconds = min(max(seconds, 0.0), self.options.max_retry_after_s)
        until = time.monotonic() + seconds
        if until <= self.paused_until:
            return
        self.paused_until = until
        if self._unpause is not None:
            self._unpause.cancel()
        self._unpause = _loop().call_later(seconds, self.refresh)
        self.refresh()

    # --- state ----------------------------------------------------------------------------------------

    def _set(self, state: State) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.state = state
        self.failures = 0
        self.successes = 0
        self.probes = 0
        if state is OPEN:
            self.opened += 1
            self.opened_at = time.time()
            self._timer = _loop().call_later(self.options.open_s, self._half_open)
        elif state is CLOSED:
            log.warning("backend %s: circuit closed", self._backend.name)
        self.refresh()

    def _half_open(self) -> None:
        self._timer = None
        confirm = self.confirm
        if confirm is not None:
            if self._confirming is None:
                self._confirming = _loop().create_task(self._half_open_if_passing(confirm))
            else:  # a check asked for by `suspect` is still running: look again after it
                self._timer = _loop().call_later(self.options.open_s, self._half_open)
            return
        log.warning("backend %s: circuit half-open, probing", self._backend.name)
        self._set(HALF_OPEN)

    async def _half_open_if_passing(self, confirm: Callable[[], Awaitable[bool]]) -> None:
        try:
            passes = await confirm()
        finally:
            self._confirming = None
        if self.state is not OPEN or self._timer is not None:
            return
        if passes:
            log.warning("backend %s: circuit half-open (health check passes), probing", self._backend.name)
            self._set(HALF_OPEN)
        else:
            self._timer = _loop().call_later(self.options.open_s, self._half_open)

    def refresh(self) -> None:
        """Recompute the one flag routing reads."""
        b = self._backend
        if b.health_ok:
            self.health_failing_since = None
        elif self.health_failing_since is None:
            self.health_failing_since = time.time()
        b.healthy = (
            b.health_ok
            and not b.draining
            and self.state is not OPEN
            and time.monotonic() >= self.paused_until - 0.01  # a timer may fire a little early
        )

    def close(self) -> None:
        """Cancel timers (at shutdown)."""
        for handle in (self._timer, self._unpause):
            if handle is not None:
                handle.cancel()
        self._timer = self._unpause = None
        if self._confirming is not None:
            self._confirming.cancel()
            self._confirming = None


def _loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()
