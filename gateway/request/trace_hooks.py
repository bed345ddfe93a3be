"""What the request path tells a request's trace, and the trace of a request that is not traced.

The steps never ask whether a request is traced: the attempts call these hooks on `ctx.trace`, and the end
of the request calls `finish` or `fail`. A sampled request's hooks are a `RequestTrace`
(gateway/telemetry/tracing.py); every other request shares `UNTRACED`, whose hooks do nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from backends.models import Backend
    from gateway.ledger.records import UsageRecord
    from gateway.request.context import RequestContext


class AttemptHooks(Protocol):
    def attempt(self, backend: Backend, number: int) -> bytes:
        """An attempt starts; returns header lines the backend gets (its `traceparent`), or b""."""
        ...

    def attempt_done(self, status: int | None, error: str | None = None) -> None: ...

    def finish(self, ctx: RequestContext, record: UsageRecord) -> None:
        """The request was accounted."""
        ...

    def fail(self, ctx: RequestContext, status: int, code: str | int | None, message: str) -> None:
        """The request ended without an answer to account."""
        ...


class Untraced:
    __slots__ = ()

    def attempt(self, backend: Backend, number: int) -> bytes:
        return b""

    def attempt_done(self, status: int | None, error: str | None = None) -> None:
        return None

    def finish(self, ctx: RequestContext, record: UsageRecord) -> None:
        return None

    def fail(self, ctx: RequestContext, status: int, code: str | int | None, message: str) -> None:
        return None


UNTRACED = Untraced()
