"""Where this replica's batch lines go: the backends with headroom (gateway/batch/headroom.py), cheapest
first, whatever pool the online routes prefer. Tracks the lines it has on each backend, so the headroom
counts them, and the lines sent since each backend's last scrape, which the scraped figures do not show.

A backend paused on its predicted latency resumes only once it has gone `resume_after_s` without a
reason to pause: predicted latency is an average of recent requests, and one that dips under the margin
for a moment (a few short answers) must not reopen a backend online traffic is using. A backend paused on
a queue (vLLM's, or the gateway's) resumes as soon as the queue is seen empty: a scrape measures it.
"""

from __future__ import annotations

import time

from backends.catalog import Catalog
from backends.models import Backend
from gateway.batch.headroom import (
    BatchLoad,
    HeadroomLimits,
    OnlineLimits,
    Room,
    assess,
    online_limits,
    picks,
)
from gateway.batch.slowdown import LineShape, line_cost
from gateway.request.context import RequestContext
from gateway.request.pipeline import Pipeline
from policies.config import Route
from policies.engine import PolicyEngine

BATCH_CLASS = "batch"


class FleetRoom:
    def __init__(
        self, catalog: Catalog, pipeline: Pipeline, limits: HeadroomLimits, resume_after_s: float = 0.0
    ) -> None:
        self.catalog = catalog
        self.pipeline = pipeline
        """Read each time for what changes as the gateway runs: the policy serving now (a reload swaps it)
        and the requests waiting for room (back-pressure)."""
        self.limits = limits
        self.resume_after_s = resume_after_s
        self._paused_at: dict[Backend, float] = {}
        """When each backend last had a reason to pause (monotonic)."""
        self.lines: dict[Backend, int] = {}
        """This replica's batch lines running on each backend."""
        self._sent: dict[Backend, list[float]] = {}
        """Monotonic times lines were sent to each backend, since its last scrape."""
        self._router: object = None
        self._routes: dict[str, Route] = {}
        self._per_backend: dict[Backend, OnlineLimits] = {}
        self._scrape_seen: dict[Backend, float | None] = {}
        self._settled: dict[Backend, int] = {}
        """Lines running at each backend's last scrape, from which the ramp counts."""
        self.shape = LineShape()
        """The recent lines' prompt and output tokens: what one more line costs the online requests."""
        self.contexts: dict[object, RequestContext] = {}
        """The running lines' requests, by line: those holding a backend's in-flight slot are not online."""

    def _online_of(self, backend: Backend) -> OnlineLimits:
        router = self.pipeline.router
        if router is not self._router:
            self._router = router
            routes = router.loaded.policy.routes if isinstance(router, PolicyEngine) else {}
            self._routes = dict(routes)
            self._per_backend = {}
        online = self._per_backend.get(backend)
        if online is None:
            online = online_limits(self._routes, backend, self.limits.default_kv_limit, BATCH_CLASS)
            self._per_backend[backend] = online
        return online

    def _load(self, backend: Backend, held: dict[Backend, int]) -> BatchLoad:
        sent = self._sent.get(backend)
        scraped = backend.load.scraped_at
        if sent and scraped is not None:
            sent[:] = [t for t in sent if t > scraped]
        lines, unseen = self.lines.get(backend, 0), len(sent) if sent else 0
        if self._scrape_seen.get(backend) != scraped:  # a new scrape: the lines it saw running
            self._scrape_seen[backend] = scraped
            self._settled[backend] = lines - unseen
        mine = held.get(backend, 0)
        online = max(0, backend.inflight - mine)
        classes = {cls: n for cls, n in backend.inflight_by_class.items() if n > 0}
        if mine and BATCH_CLASS in classes:  # this replica's lines run as class batch: not online
            left = classes[BATCH_CLASS] - mine
            if left > 0:
                classes[BATCH_CLASS] = left
            else:
                del classes[BATCH_CLASS]
        cost = line_cost(backend.pool.accelerator, self.shape, backend.models)
        settled = self._settled.get(backend)
        return BatchLoad(lines, unseen, settled, online, cost, classes, self.shape.prompt_tokens)

    def _held(self) -> dict[Backend, int]:
        """Batch lines holding each backend's in-flight slot (`backend.inflight` counts every request)."""
        held: dict[Backend, int] = {}
        for ctx in self.contexts.values():
            if ctx.holding and ctx.backend is not None:
                held[ctx.backend] = held.get(ctx.backend, 0) + 1
        return held

    def rooms(self, model: str) -> list[Room]:
        queued, held = self.pipeline.queued, self._held()
        return [
            assess(b, self._load(b, held), self._online_of(b), queued, self.limits)
            for b in self.catalog.serving(model)
        ]

    def plan(self, model: str) -> list[Backend]:
        """One backend per new line that may start now, in the order they should be filled."""
        now = time.monotonic()
        open_rooms = []
        for room in self.rooms(model):
            if room.paused is not None:
                if room.averaged:
                    self._paused_at[room.backend] = now
            elif now - self._paused_at.get(room.backend, -1e9) >= self.resume_after_s:
                open_rooms.append(room)
        return picks(open_rooms)

    def started(self, backend: Backend) -> None:
        self.lines[backend] = self.lines.get(backend, 0) + 1
        self._sent.setdefault(backend, []).append(time.monotonic())

    def ended(self, backend: Backend) -> None:
        left = self.lines.get(backend, 0) - 1
        if left > 0:
            self.lines[backend] = left
        else:
            self.lines.pop(backend, None)
