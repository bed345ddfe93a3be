"""One request as it goes through the steps: each step fills its part, and the end reads all of it.

    step        fills
    parse       started_ns and trace (with tracing on), parsed
    classify    profile, classified_ns
    route       decision, limits, routed_ns
    forward     backend (holding one of its in-flight slots), concurrency, attempts, tried, started_at,
                first_byte_at, status
    relay       sse, ended_at
    end         accounting_ns, ended (gateway/request/pipeline.py `Pipeline.end`)

A backend's in-flight count goes up and down here only (`hold`, `release`): the attempt that sends the
request holds a slot, a failed attempt gives it back, and the end of the request gives back the last.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from backends.models import Backend
    from gateway.ledger.records import UsageRecord
    from gateway.openai.responses import Usage
    from gateway.request.classify import Caller
    from gateway.request.limits import Limits
    from gateway.request.parse import Endpoint, ParsedRequest
    from gateway.request.sse import SseRelay
    from policies.framework import Decision
    from policies.profile import RequestProfile


# --- what the request path tells a request's trace -----------------------------------------------------
# What the request path tells a request's trace, and the trace of a request that is not traced.
#
# The steps never ask whether a request is traced: the attempts call these hooks on `ctx.trace`, and the end
# of the request calls `finish` or `fail`. A sampled request's hooks are a `RequestTrace`
# (gateway/telemetry/tracing.py); every other request shares `UNTRACED`, whose hooks do nothing.


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


class Tracer(Protocol):
    """Starts a request's trace: gateway/telemetry/tracing.py `Tracing`."""

    def start(self, endpoint: Endpoint, caller: Caller) -> AttemptHooks: ...

    def shutdown(self) -> None:
        """The app stops: export the last spans."""
        ...


class FailureListener(Protocol):
    """Told of every request that ended in an error: gateway/telemetry `Telemetry`."""

    def failed(
        self,
        request_id: str,
        endpoint: Endpoint,
        status: int,
        code: str | int | None,
        message: str,
        body: bytes | None,
    ) -> None: ...

    def close(self) -> None:
        """The app stops: write out what is buffered."""
        ...


class Observer(FailureListener, Protocol):
    """Told of the end of every request: its ledger record, or its error: gateway/telemetry `Telemetry`."""

    def recorded(self, record: UsageRecord, parsed: ParsedRequest) -> None: ...


@dataclass(slots=True, eq=False)
class RequestContext:
    """What is known about one request so far (see the module docstring for which step sets what)."""

    endpoint: Endpoint
    caller: Caller
    body: bytes = b""
    # Set by their step before any later step reads them, so typed as set (the steps read them without a
    # check); still None only where a request that failed earlier ends, and that code checks for None.
    parsed: ParsedRequest = None  # type: ignore[assignment]
    profile: RequestProfile = None  # type: ignore[assignment]
    decision: Decision = None  # type: ignore[assignment]
    limits: Limits = None  # type: ignore[assignment]
    trace: AttemptHooks = UNTRACED
    """The request's trace when sampled (gateway/telemetry/tracing.py), else a hook that does nothing."""
    started_ns: int = 0
    classified_ns: int = 0
    routed_ns: int = 0
    accounting_ns: int = 0
    backend: Backend | None = None
    """The backend the request was last sent to."""
    holding: bool = False
    """`backend.inflight` counts this request."""
    held_class: str = ""
    """The class `backend.inflight_by_class` counts this request under while it holds its slot."""
    held_tokens: int = 0
    """The prompt tokens `backend.prompt_tokens_by_class` counts for it while it holds its slot."""
    concurrency: int = 0
    """Requests the backend was serving, this one included, when it was sent."""
    attempts: int = 0
    """Backends tried, the last included."""
    tried: list[str] | None = None
    """Names of the backends tried, once there was more than one."""
    queued_s: float = 0.0
    """Seconds it waited for room (back-pressure) before it was routed for good."""
    started_at: float = 0.0
    first_byte_at: float = 0.0
    ended_at: float = 0.0
    status: int = 0
    usage: Usage | None = None
    """A non-streaming answer's usage (a stream's is on `sse`)."""
    sse: SseRelay | None = None
    ended: bool = False

    @property
    def request_id(self) -> str:
        return self.caller.request_id

    @property
    def seqs(self) -> int:
        """The backend's sequences the request holds: one per choice."""
        return self.profile.n if self.profile is not None else 1

    def hold(self, backend: Backend) -> None:
        """The request is being sent to `backend`: one of its in-flight slots is taken."""
        self.backend = backend
        backend.inflight += 1
        backend.inflight_seqs += self.seqs
        cls = self.held_class = self.decision.request_class if self.decision is not None else ""
        by_class = backend.inflight_by_class
        by_class[cls] = by_class.get(cls, 0) + 1
        tokens = self.held_tokens = self.profile.prompt_tokens_estimate if self.profile is not None else 0
        by_tokens = backend.prompt_tokens_by_class
        by_tokens[cls] = by_tokens.get(cls, 0) + tokens
        self.holding = True

    def release(self) -> None:
        """Give the in-flight slot back (no-op when none is held)."""
        if self.holding:
            self.holding = False
            backend = self.backend
            assert backend is not None  # holding a slot means a backend holds it
            backend.inflight -= 1
            backend.inflight_seqs -= self.seqs
            backend.inflight_by_class[self.held_class] -= 1
            backend.prompt_tokens_by_class[self.held_class] -= self.held_tokens

    def tried_names(self) -> list[str]:
        """The backends tried, in order."""
        if self.tried is not None:
            return self.tried
        return [self.backend.name] if self.backend is not None else []
