"""One fleet view across replicas (and `gateway.workers`), shared through the ledger's Redis.

What is shared, under the deployment's hash tag `{sy:<key_prefix>}` (one Redis Cluster slot):

    {sy:P}:fleet:drain          hash backend -> "1"/"0": the drain state every replica applies
    {sy:P}:fleet:events         pub/sub channel: "a drain changed", breaker openings, policy changes
    {sy:P}:fleet:replica:<id>   JSON view of one replica (its backends, its policy), EX VIEW_TTL
    {sy:P}:fleet:replicas       sorted set id -> last heartbeat, to list the live views (PX VIEW_TTL)
    {sy:P}:fleet:recent         list of the latest records of every replica (`/admin/v1/requests`)

A drain is written to the hash and announced on the channel; every replica re-reads the hash when told
(milliseconds) and again every `interval` (a missed message, a late start or a reconnect catches up).
A breaker opening is a hint: it shows in every replica's `/admin/v1/backends`, and each replica's own
breaker still decides. Nothing here is on the request path: the views are cached by the background
loop, so the admin handlers read memory. Without Redis a replica serves on its own view, says so in
`/ready` and `/metrics`, keeps its operators' drains, and writes them when Redis is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import socket
import time
from dataclasses import asdict
from typing import Any

import msgspec

from backends.catalog import Catalog
from backends.models import Backend
from gateway.ledger.records import Ledger
from gateway.redis.client import REDIS_ERRORS, as_text, redis_client, subscriber
from gateway.request.pipeline import Pipeline

log = logging.getLogger("switchyard.fleet")

VIEW_TTL = 5.0
"""Seconds a replica's view outlives its last heartbeat (a replica gone for longer drops out)."""
RECENT_KEEP = 1000
REPLICA_ENV = "SWITCHYARD_REPLICA"


def replica_id() -> str:
    return os.environ.get(REPLICA_ENV) or f"{socket.gethostname()}-{os.getpid()}"


def policy_version(router: object) -> str:
    """The policy's name and a digest of its content: replicas in agreement show the same string."""
    name = getattr(router, "name", type(router).__name__)
    loaded = getattr(router, "loaded", None)
    if loaded is None:
        return str(name)
    digest = hashlib.sha256(msgspec.json.encode(loaded.policy)).hexdigest()[:12]
    return f"{name}@{digest}"


class FleetSync:
    def __init__(
        self,
        redis_url: str,
        prefix: str,
        pipeline: Pipeline,
        catalog: Catalog,
        ledger: Ledger,
        replica: str | None = None,
        interval: float = 0.5,
        timeout: float = 1.0,
    ) -> None:
        self.replica = replica or replica_id()
        self.interval = interval
        self._pipeline = pipeline
        """Read for the policy serving now only (a reload swaps it)."""
        self._catalog = catalog
        self._ledger = ledger
        self._by_name: dict[str, Backend] = {b.name: b for b in catalog.backends}
        tag = "{sy:" + prefix + "}"
        self.k_drain = f"{tag}:fleet:drain"
        self.k_events = f"{tag}:fleet:events"
        self.k_replicas = f"{tag}:fleet:replicas"
        self.k_recent = f"{tag}:fleet:recent"
        self._view_prefix = f"{tag}:fleet:replica:"
        common: dict[str, Any] = {"decode_responses": True, "socket_connect_timeout": timeout}
        self.client = redis_client(redis_url, socket_timeout=timeout, **common)
        self._listen_client = redis_client(redis_url, **common)
        self.connected = False
        self.listening = False
        self.errors = 0
        self.last_error: str | None = None
        self._pending: dict[str, bool] = {}
        """Drains made by this replica's operators and not yet written (Redis unreachable)."""
        self._opened: dict[str, int] = {b.name: b.breaker.opened for b in catalog.backends}
        self.hints: dict[str, dict[str, float]] = {}
        """backend -> {replica: time its breaker opened} (wall clock), from every replica."""
        self.views: list[dict[str, Any]] = []
        self._last_record: object | None = None
        self._router: object | None = None
        self.policy = ""
        self._tasks: list[asyncio.Task[None]] = []

    # --- what the admin endpoints call ----------------------------------------------------------------

    @property
    def status(self) -> str:
        return "connected" if self.connected and self.listening else "unreachable"

    async def set_drain(self, name: str, draining: bool) -> bool:
        """Apply locally at once, then share; False when Redis is unreachable (shared later)."""
        self._apply(name, draining)
        self._pending[name] = draining
        try:
            await self._write_pending()
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return False
        return True

    async def recent(self, limit: int) -> list[dict[str, Any]] | None:
        """The fleet's latest records, newest last; None when Redis cannot be read (use the local log)."""
        if not self.connected:
            return None
        try:
            await self._push_recent()
            rows = await self.client.lrange(self.k_recent, -limit, -1)
        except REDIS_ERRORS as exc:
            self._failed(exc)
            return None
        return [json.loads(row) for row in rows]

    def summary(self) -> dict[str, Any]:
        return {"sync": self.status, "replica": self.replica, "replicas_seen": len(self.views)}

    def fleet_view(self) -> dict[str, Any]:
        """Every live replica's view, and per backend what they say, merged."""
        merged: dict[str, dict[str, list[str]]] = {}
        for view in self.views:
            for name, state in view.get("backends", {}).items():
                row = merged.setdefault(
                    name, {"routable_on": [], "draining_on": [], "breaker_open_on": [], "breaker_hints": []}
                )
                if state.get("routable"):
                    row["routable_on"].append(view["replica"])
                if state.get("draining"):
                    row["draining_on"].append(view["replica"])
                if state.get("breaker") == "open":
                    row["breaker_open_on"].append(view["replica"])
        now = time.time()
        for name, by in self.hints.items():
            recent = [r for r, at in by.items() if now - at < VIEW_TTL * 6]
            if recent and name in merged:
                merged[name]["breaker_hints"] = sorted(recent)
        policies = sorted({v.get("policy", "") for v in self.views})
        return {**self.summary(), "policies": policies, "backends": merged, "replicas": self.views}

    def metrics_text(self) -> str:
        return (
            "# HELP switchyard_fleet_sync_connected 1 when this replica shares the fleet view through Redis,"
            " 0 when it serves on its own view.\n"
            "# TYPE switchyard_fleet_sync_connected gauge\n"
            f"switchyard_fleet_sync_connected {int(self.status == 'connected')}\n"
            "# HELP switchyard_fleet_replicas Replicas whose view this replica sees.\n"
            "# TYPE switchyard_fleet_replicas gauge\n"
            f"switchyard_fleet_replicas {len(self.views)}\n"
            "# HELP switchyard_fleet_sync_errors_total Failed Redis calls of the fleet view.\n"
            "# TYPE switchyard_fleet_sync_errors_total counter\n"
            f"switchyard_fleet_sync_errors_total {self.errors}\n"
        )

    # --- background -----------------------------------------------------------------------------------

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen(), name="switchyard-fleet-listen"),
            asyncio.create_task(self._beat(), name="switchyard-fleet-beat"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        with contextlib.suppress(*REDIS_ERRORS):
            await self._push_recent()
            await self.client.zrem(self.k_replicas, self.replica)
            await self.client.delete(self._view_prefix + self.replica)
        await self.client.aclose()
        await self._listen_client.aclose()

    async def _listen(self) -> None:
        while True:
            pubsub = None
            try:
                pubsub = await subscriber(self._listen_client)
                await pubsub.subscribe(self.k_events)
                self.listening = True
                await self._read_drains()  # catch up on what was missed while away
                async for message in pubsub.listen():
                    if message.get("type") == "message":
                        await self._on_event(json.loads(message["data"]))
            except asyncio.CancelledError:
                raise
            except (*REDIS_ERRORS, ValueError) as exc:
                self.listening = False
                self._failed(exc)
                await asyncio.sleep(self.interval)
            finally:
                self.listening = False
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()

    async def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "drain":
            await self._read_drains()
        elif kind == "breaker":
            self.hints.setdefault(str(event["backend"]), {})[str(event["replica"])] = float(event["at"])
        elif kind == "policy":
            await self._read_views()

    async def _beat(self) -> None:
        while True:
            try:
                await self._write_pending()
                await self._read_drains()
                await self._announce_breakers()
                await self._push_recent()
                await self._write_view()
                await self._read_views()
                if not self.connected and self.errors:
                    log.warning("fleet view shared through Redis again (replica %s)", self.replica)
                self.connected = True
            except asyncio.CancelledError:
                raise
            except REDIS_ERRORS as exc:
                self._failed(exc)
            await asyncio.sleep(self.interval)

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        if self.connected:
            log.warning("fleet view: Redis unreachable, serving on this replica's own view (%s)", exc)
        self.connected = False

    def _apply(self, name: str, draining: bool) -> None:
        backend = self._by_name.get(name)
        if backend is None or backend.draining == draining:
            return
        backend.draining = draining
        backend.breaker.refresh()
        log.warning("backend %s %s (fleet view)", name, "drained" if draining else "undrained")

    async def _write_pending(self) -> None:
        if not self._pending:
            return
        pending = dict(self._pending)
        await self.client.hset(self.k_drain, mapping={n: "1" if d else "0" for n, d in pending.items()})
        for name, draining in pending.items():
            if self._pending.get(name) == draining:
                del self._pending[name]
        await self._publish({"kind": "drain", "replica": self.replica})

    async def _read_drains(self) -> None:
        state = await self.client.hgetall(self.k_drain)
        for name, flag in state.items():
            if name not in self._pending:
                self._apply(as_text(name), flag == "1")

    async def _announce_breakers(self) -> None:
        for backend in self._catalog.backends:
            opened = backend.breaker.opened
            if opened > self._opened.get(backend.name, 0):
                self._opened[backend.name] = opened
                at = time.time()
                self.hints.setdefault(backend.name, {})[self.replica] = at
                event = {"kind": "breaker", "backend": backend.name, "replica": self.replica, "at": at}
                await self._publish(event)

    async def _publish(self, event: dict[str, Any]) -> None:
        await self.client.publish(self.k_events, json.dumps(event))

    async def _push_recent(self) -> None:
        records = self._ledger.recent(RECENT_KEEP)
        fresh: list[str] = []
        for record in reversed(records):
            if record is self._last_record:
                break
            fresh.append(json.dumps({**asdict(record), "replica": self.replica}))
        if not fresh:
            return
        self._last_record = records[-1]
        fresh.reverse()
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.rpush(self.k_recent, *fresh)
            pipe.ltrim(self.k_recent, -RECENT_KEEP, -1)
            await pipe.execute()

    async def _write_view(self) -> None:
        router = self._pipeline.router
        if router is not self._router:
            self._router = router
            version = policy_version(router)
            changed = bool(self.policy) and version != self.policy
            self.policy = version
            if changed:
                await self._publish({"kind": "policy", "replica": self.replica, "policy": version})
        now = time.time()
        view = {
            "replica": self.replica,
            "at": round(now, 3),
            "policy": self.policy,
            "backends": {
                b.name: {
                    "routable": b.healthy,
                    "healthy": b.health_ok,
                    "draining": b.draining,
                    "breaker": b.breaker.state,
                    "breaker_opened": b.breaker.opened,
                    "inflight": b.inflight,
                }
                for b in self._catalog.backends
            },
        }
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.set(self._view_prefix + self.replica, json.dumps(view), px=int(VIEW_TTL * 1000))
            pipe.zadd(self.k_replicas, {self.replica: now})
            pipe.zremrangebyscore(self.k_replicas, "-inf", now - VIEW_TTL)
            # Past VIEW_TTL without a heartbeat it lists no live view: gone with the last replica, not
            # kept holding the ids of replicas killed before they could take themselves out.
            pipe.pexpire(self.k_replicas, int(VIEW_TTL * 1000))
            await pipe.execute()

    async def _read_views(self) -> None:
        ids = await self.client.zrangebyscore(self.k_replicas, time.time() - VIEW_TTL, "+inf")
        if not ids:
            self.views = []
            return
        # redis-py types a range reply as (member, score) pairs too, whatever `withscores` says
        raw = await self.client.mget([self._view_prefix + i for i in ids])  # type: ignore[operator]
        self.views = sorted((json.loads(r) for r in raw if r), key=lambda v: v["replica"])


def start_fleet_sync(
    redis_url: str | None, prefix: str, pipeline: Pipeline, catalog: Catalog, ledger: Ledger
) -> FleetSync | None:
    """The fleet view, when the deployment has a Redis (the ledger's); None runs on the local view."""
    if not redis_url:
        return None
    sync = FleetSync(redis_url, prefix, pipeline, catalog, ledger)
    sync.start()
    return sync
