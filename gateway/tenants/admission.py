"""The seam the request path calls: `authenticate` at the edge, `check` + `admit` once the request is
routed, `settle` once from the request's end (docs/keys.md).

Hot path cost: a cached key lookup (no I/O) and one Redis round trip (`limits.ADMIT`). Settling is
batched in the background (`Settler`). Key lookups are cached per replica; a background task polls the
store's version every `auth.refresh_interval` and drops the cache when anything changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from backends.models import Backend
from gateway.config.settings import AuthOptions
from gateway.ledger.records import Ledger
from gateway.openai.errors import GatewayError
from gateway.redis.client import AnyRedis
from gateway.redis.script_client import ScriptClient
from gateway.tenants import errors
from gateway.tenants.admit_batch import AdmitBatcher, render
from gateway.tenants.answers import (
    decoded,
    encoded,
    limit_headers,
    pairs,
    rate_headers,
    refusal,
    verdict_of,
)
from gateway.tenants.key_lookup import KeyLookup, Tenant
from gateway.tenants.keys import hash_key
from gateway.tenants.limits import (
    ADMIT,
    NANO,
    SLOT_LEASE_S,
    LocalCounters,
    ScopeCounters,
    Verdict,
    nano,
)
from gateway.tenants.prepared import SettleNames, prepare, settle_names
from gateway.tenants.reservation import max_cost_usd, max_output_tokens
from gateway.tenants.settler import Settler
from gateway.tenants.store import TenantStore
from gateway.tenants.usage_watch import BudgetWatch
from policies.profile import RequestProfile

log = logging.getLogger("switchyard.tenants")

_CACHE_MAX = 50_000
_REDIS_RETRY_S = 1.0
"""After a failed Redis call, admissions use the local share for this long before trying Redis again."""


@dataclass(slots=True)
class Admission:
    scopes: list[ScopeCounters]
    tokens: int
    cost_nano: int
    window: int
    local: bool
    """Admitted from this replica's local share (Redis away): settled locally."""
    raw_headers: list[tuple[bytes, bytes]]
    """`x-switchyard-hints-ignored` and the budget reserved, for the answer (as ASGI sends headers: built
    as bytes once, not as text then encoded)."""
    settled: bool = False
    names: SettleNames = ()
    """The shared counters to settle (`Prepared.names_for`); empty: built when settling."""
    rate_lines: bytes = b""
    """`x-ratelimit-*` as the head's lines (`HeaderPlan.lines`)."""

    def headers(self) -> list[tuple[bytes, bytes]]:
        """All of the answer's headers above, as ASGI headers."""
        return pairs(self.rate_lines) + self.raw_headers


@dataclass
class Tenants:
    options: AuthOptions
    store: TenantStore
    ledger: Ledger
    prefix: str
    client: AnyRedis | None = None
    """Redis for the shared counters; None: this replica's counters are the whole truth (memory store)."""
    admin_hash: str | None = None
    _version: int = -1
    _redis_down_until: float = 0.0
    _task: asyncio.Task[None] | None = None
    _closing: bool = False
    """Set by `close`: the background loops stop on it, not only on a cancellation (redis-py can swallow
    one that lands while it reconnects: the call then returns and the loop would go on forever)."""
    _last_headers: dict[str, Admission | list[tuple[bytes, bytes]]] = field(default_factory=dict)
    """Per key id: the `x-ratelimit-*` headers of its latest admission here (for errors before one)."""

    def __post_init__(self) -> None:
        self.keys = KeyLookup(self.store, self.admin_hash, self.options.redis_timeout)
        self.authenticate = self.keys.authenticate
        """The caller's tenant, or 401 `invalid_api_key` (gateway/tenants/key_lookup.py)."""
        ns = "{syt:" + self.prefix + "}"
        self._ns = ns
        self.local = LocalCounters(self.options.window_s)
        self.away = LocalCounters(self.options.window_s, share=1.0 / self.options.replicas)
        self.window_ms = self.options.window_s * 1000
        self.replica = os.urandom(6).hex()
        """This process's id in the parallel-slot hashes; its slots count while its lease lives."""
        self._lease_key = f"{ns}:lease:{self.replica}"
        client, timeout = self.client, self.options.redis_timeout
        self.settler = Settler(client, timeout, self.replica, ns) if client is not None else None
        self._lease_task: asyncio.Task[None] | None = None
        self.watch = BudgetWatch()
        self._admit = ScriptClient.like(client, ADMIT, timeout, ns) if client is not None else None
        self._batcher = (
            AdmitBatcher(self._admit, self.window_ms, self.replica, ns, self.settler)
            if self._admit is not None
            else None
        )

    def admission_series(self) -> str:
        """`/metrics` series of the admissions' round trips to Redis (none without Redis)."""
        return render(self._batcher) if self._batcher is not None else ""

    @classmethod
    def admin_hash_from_env(cls, options: AuthOptions) -> str | None:
        material = os.environ.get(options.admin_key_env)
        return hash_key(material) if material else None

    # --- lifetime ------------------------------------------------------------------------------------

    async def start(self) -> None:
        with contextlib.suppress(Exception):
            self._version = await self.store.version()
        self._task = asyncio.create_task(self._watch_versions())
        if self.settler is not None:
            self.settler.start()
        if self.client is not None:
            with contextlib.suppress(Exception):
                await self._renew_lease()
            self._lease_task = asyncio.create_task(self._keep_lease())

    async def close(self) -> None:
        self._closing = True
        for task in (self._task, self._lease_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.settler is not None:
            await self.settler.close()
        if self._admit is not None:
            await self._admit.close()
        if self.client is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.options.redis_timeout):
                    await self.client.delete(self._lease_key)
        await self.store.close()

    async def _watch_versions(self) -> None:
        failing = False
        while not self._closing:
            await asyncio.sleep(self.options.refresh_interval)
            try:
                await self.sync()
            except Exception as exc:
                if not failing:
                    log.warning("tenants: cannot read the key store (%s); cached keys stay in use", exc)
                failing = True
                continue
            failing = False

    async def sync(self) -> None:
        """Read the store's version now and forget the cached keys if anything changed (raises when the
        store cannot be read). The batch scheduler calls it before handing out lines."""
        async with asyncio.timeout(self.options.redis_timeout):
            version = await self.store.version()
        if version != self._version:
            self._version = version
            self._forget()

    def _forget(self) -> None:
        self.keys.forget()

    async def _renew_lease(self) -> None:
        client = self.client
        assert client is not None  # a lease is kept only with a Redis
        async with asyncio.timeout(self.options.redis_timeout):
            await client.set(self._lease_key, b"1", px=int(SLOT_LEASE_S * 1000))

    async def _keep_lease(self) -> None:
        """Keep this replica's parallel slots counted (limits.ADMIT); a dead replica's lapse in seconds."""
        while not self._closing:
            await asyncio.sleep(SLOT_LEASE_S / 3)
            try:
                await self._renew_lease()
            except Exception as exc:
                log.debug("tenants: cannot renew the slot lease (%s)", exc)

    def changed(self, version: int) -> None:
        """This replica changed a key or team (the store is now at `version`): forget cached lookups now.
        If nobody else changed anything since the last poll, the poll need not forget them again."""
        self._forget()
        if version == self._version + 1:
            self._version = version

    # --- the edge ------------------------------------------------------------------------------------

    async def resolve(self, key_id: str) -> Tenant:
        """The key `key_id` as it is now, for work a key started that runs without its material (a
        batch's lines): 401 `key_revoked`, `key_expired`, `key_not_found`, or 503 `limits_unavailable`."""
        return await self.keys.resolve(key_id)

    # --- after classify: what the key may ask for ------------------------------------------------------

    def check(self, tenant: Tenant, profile: RequestProfile) -> None:
        """403 for a model the key may not use. (Its hints were capped when the profile was built:
        gateway/request/allowance.py.)"""
        key = tenant.key
        if key.models and profile.model not in key.models:
            raise errors.model_not_allowed(profile.model)

    # --- after routing: limits and budget ---------------------------------------------------------------

    async def admit(
        self, tenant: Tenant, profile: RequestProfile, candidates: Sequence[Backend], ignored: list[str]
    ) -> Admission:
        """Reserve the request in every counter of its key and team, or raise 429 / 503."""
        now = time.time()
        prepared = tenant.prepared
        if prepared is None or now >= prepared.until:
            prepared = tenant.prepared = prepare(tenant.key, tenant.team, now)
        scopes, budgeted = prepared.scopes, prepared.budgeted
        prompt = profile.prompt_tokens_estimate
        completion = max_output_tokens(candidates, prompt, profile.max_tokens, profile.n)
        tokens = prompt + completion
        cost = nano(max_cost_usd(self.ledger, candidates, prompt, completion)) if budgeted else 0
        local = False
        if self._admit is None:
            verdict = self.local.admit(scopes, tokens, cost)
        elif time.monotonic() < self._redis_down_until:
            verdict, local = self._away(scopes, tokens, cost, budgeted, "recently unreachable"), True
        else:
            batcher = self._batcher
            assert batcher is not None
            try:
                # The client's socket timeout (`auth.redis_timeout`) bounds the call: no timer per request.
                answer = batcher.admit(tokens, cost, prepared.scope_args)
                try:
                    verdict = verdict_of(await answer)
                except asyncio.CancelledError:
                    batcher.orphan(answer, lambda reply: self._give_back(reply, scopes, tokens, cost))
                    raise
            except Exception as exc:
                self._redis_down_until = time.monotonic() + _REDIS_RETRY_S
                log.warning("tenants: Redis unreachable for limits (%s); %s", exc, self.options.redis_away)
                verdict, local = self._away(scopes, tokens, cost, budgeted, exc.__class__.__name__), True
        self.watch.observe(scopes, verdict, cost, prepared.budget_nanos)
        last = self._last_headers
        if len(last) >= _CACHE_MAX:
            last.clear()
        if not verdict.admitted:
            headers = rate_headers([scopes[verdict.refused_scope]], verdict)
            if ignored:
                headers["x-switchyard-hints-ignored"] = ",".join(ignored)
            if budgeted:
                headers["x-switchyard-budget-reserved-usd"] = f"{cost / NANO:.10f}"
            last[tenant.key.id] = encoded(headers)
            raise refusal(scopes[verdict.refused_scope], verdict, headers, tokens)
        raw: list[tuple[bytes, bytes]] = []
        if ignored:
            raw.append((b"x-switchyard-hints-ignored", ",".join(ignored).encode()))
        if budgeted:
            raw.append((b"x-switchyard-budget-reserved-usd", b"%.10f" % (cost / NANO)))
        names = () if local or self.settler is None else prepared.names_for(self._ns, verdict.window)
        lines = prepared.header_plan.lines(verdict)
        last[tenant.key.id] = admitted = Admission(
            scopes, tokens, cost, verdict.window, local, raw, False, names, lines
        )
        return admitted

    def _give_back(self, reply: bytes, scopes: list[ScopeCounters], tokens: int, cost: int) -> None:
        """An admission answered after its request was cancelled: release what it reserved, if anything."""
        verdict = verdict_of(reply)
        if verdict.admitted:
            self.release(Admission(scopes, tokens, cost, verdict.window, False, []))

    def _away(self, scopes: list[ScopeCounters], tokens: int, cost: int, budgeted: bool, why: str) -> Verdict:
        if self.options.redis_away == "fail_closed":
            raise errors.limits_unavailable(f"Redis {why}")
        if budgeted:
            # A budget is one number shared by every replica: a local share could be spent by each while
            # the others spend the rest, so money is only promised against the shared counter.
            raise errors.limits_unavailable(f"Redis {why}; budgets need the shared counter")
        verdict = self.away.admit(scopes, tokens, cost)
        if verdict.admitted and self.settler is not None:
            # Reconcile: once Redis is back the shared window counters learn what this replica admitted
            # from its share, so the others count it too (`Settler` keeps the deltas until then).
            ns, window, add = self._ns, verdict.window, self.settler.add
            for s in scopes:
                add(f"{ns}:rq:{s.name}:{window}", 1)
                add(f"{ns}:tk:{s.name}:{window}", tokens)
        return verdict

    def with_rate_headers(
        self, error: GatewayError, tenant: Tenant, admission: Admission | None
    ) -> GatewayError:
        """`error` carrying the key's `x-ratelimit-*` headers (every answer to a key has them): the
        request's own admission's, or before admission the key's latest here, or its bare limits."""
        if "x-ratelimit-reset-requests" in error.headers or "x-ratelimit-reset-tokens" in error.headers:
            return error
        last = admission if admission is not None else self._last_headers.get(tenant.key.id)
        raw = last.headers() if isinstance(last, Admission) else last
        headers = decoded(raw) if raw else limit_headers(tenant.key, tenant.team)
        if not headers:
            return error
        answer = GatewayError(error.status, "", "", headers={**headers, **error.headers})
        answer.body = error.body
        return answer

    # --- the request's end ------------------------------------------------------------------------------

    def settle(
        self, admission: Admission, prompt_tokens: int, completion_tokens: int, cost_usd: float
    ) -> None:
        """Replace the reservation by what the request used (once; later calls are ignored)."""
        if admission.settled:
            return
        admission.settled = True
        token_delta = prompt_tokens + completion_tokens - admission.tokens
        cost_delta = round(cost_usd * NANO) - admission.cost_nano
        settler = self.settler
        if admission.local or settler is None:
            counters = self.away if admission.local else self.local
            counters.settle(admission.scopes, admission.window, token_delta, cost_delta, -admission.cost_nano)
            if settler is None:
                return
        if admission.local:  # no shared slot or spend was taken: only the window's tokens
            ns, window = self._ns, admission.window
            for s in admission.scopes:
                settler.add(f"{ns}:tk:{s.name}:{window}", token_delta)
            return
        names = admission.names or settle_names(admission.scopes, self._ns, admission.window)
        settler.settle(names, token_delta, cost_delta, -admission.cost_nano)

    def release(self, admission: Admission) -> None:
        """The request ended without a ledger record (it failed before a backend served it)."""
        self.settle(admission, 0, 0, 0.0)

    async def usage(self, scope: str, period: str) -> dict[str, Any]:
        """A key's or team's spend in its budget period (settled and held for requests in flight: what
        its budget is checked against), what of it is held, and when it last had a request admitted."""
        last: int | bytes | str | None
        if self.client is None:
            counts = self.local._counts
            spent, held = counts.get(f"sp:{scope}:{period}", 0), counts.get(f"hd:{scope}:{period}", 0)
            last = counts.get("lu:" + scope)
        else:
            ns = self._ns
            raw = await self.client.mget(
                f"{ns}:sp:{scope}:{period}", f"{ns}:hd:{scope}:{period}", f"{ns}:lu:{scope}"
            )
            spent, held, last = int(raw[0] or 0), int(raw[1] or 0), raw[2]
        return {
            "spent_usd": spent / NANO,
            "held_usd": min(held, spent) / NANO,
            "last_used_at": int(last) if last else None,
        }

    async def spent_usd(self, scope: str, period: str) -> float:
        """Spend recorded against a budget counter (`k:<id>` or `t:<team>`), reservations included."""
        if self.client is None:
            return self.local._counts.get(f"sp:{scope}:{period}", 0) / NANO
        raw = await self.client.get(f"{self._ns}:sp:{scope}:{period}")
        return int(raw or 0) / NANO
