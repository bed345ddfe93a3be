"""How many batch lines the fleet has idle room for right now, read from the state routing reads.

A backend has room for batch work when online traffic is not using it: nothing waits in vLLM's queue,
its KV cache is under every online route's saturation limit, and no online route that prefers it is
predicted to miss its SLO there (predicted from measured latency, which batch lines already on it
raise: that is the feedback that stops adding them). While requests of any class wait in the gateway's
own back-pressure queues, batch work is paused everywhere: online traffic needs the room.
"""

from __future__ import annotations

from backends.models import Backend
from gateway.request.pipeline import Pipeline
from policies.config import Route
from policies.engine import PolicyEngine
from policies.predict import slo_miss_reason
from policies.selectors import selects

BATCH_CLASS = "batch"


class IdleRoom:
    def __init__(self, pipeline: Pipeline, per_backend: int) -> None:
        self.pipeline = pipeline
        self.per_backend = per_backend
        self._router: object = None
        self._online: list[Route] = []
        self._max_kv = 0.95

    def _online_routes(self) -> list[Route]:
        router = self.pipeline.router
        if router is not self._router:
            self._router = router
            routes = router.loaded.policy.routes if isinstance(router, PolicyEngine) else {}
            self._online = [r for name, r in routes.items() if name != BATCH_CLASS]
            limits = [r.saturation.max_kv_cache_usage for r in self._online]
            self._max_kv = min(limits, default=0.95)
        return self._online

    def has_room(self, backend: Backend) -> bool:
        if not backend.healthy or backend.draining:
            return False
        load = backend.load
        if load.waiting > 0 or load.kv_cache_usage > self._max_kv:
            return False
        for route in self._online:
            slo_here = route.slo is not None and selects(route.prefer, backend.pool)
            if slo_here and slo_miss_reason(backend, route) is not None:
                return False
        return True

    def slots(self, model: str) -> int:
        """Lines this replica may have in flight for `model` (0: paused)."""
        if self.pipeline.queued:
            return 0
        self._online_routes()
        free = sum(1 for b in self.pipeline.catalog.serving(model) if self.has_room(b))
        return free * self.per_backend
