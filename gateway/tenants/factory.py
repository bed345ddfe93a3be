"""Build the tenants service from the settings (None when nobody needs it: `open` and no admin key)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.config.settings import Settings
from gateway.ledger.records import Ledger
from gateway.redis.client import redis_client
from gateway.stopping import stop_step
from gateway.tenants.admin_key import check_admin_key
from gateway.tenants.admission import Tenants
from gateway.tenants.store import TenantStore
from gateway.tenants.store_memory import MemoryTenantStore
from gateway.tenants.store_redis import RedisTenantStore

log = logging.getLogger("switchyard.tenants")


def build_tenants(settings: Settings, ledger: Ledger) -> Tenants | None:
    """Raises WeakAdminKey for a weak admin key that nothing allows."""
    options = settings.auth
    weak = check_admin_key(options.admin_key_env, options.allow_weak_admin_key)
    if weak is not None:
        log.warning("%s", weak)
    admin_hash = Tenants.admin_hash_from_env(options)
    if options.mode == "open" and admin_hash is None:
        return None
    url = options.redis_url or settings.ledger.redis_url
    client = None
    store: TenantStore
    if options.store == "redis" or (options.store == "auto" and url):
        if not url:
            raise ValueError("auth.store is redis but neither auth.redis_url nor ledger.redis_url is set")
        # One immediate reconnect: after Redis (or the path to it) comes back, every pooled connection is
        # stale once; without the retry each would fail one request.
        client = redis_client(
            url,
            socket_connect_timeout=options.redis_timeout,
            socket_timeout=options.redis_timeout,
            retry=Retry(NoBackoff(), 1),
            retry_on_error=[RedisConnectionError],
        )
        store = RedisTenantStore(client, settings.ledger.key_prefix)
    else:
        store = MemoryTenantStore()
    return Tenants(options, store, ledger, settings.ledger.key_prefix, client=client, admin_hash=admin_hash)


def tenants_lifespan(tenants: Tenants):
    @asynccontextmanager
    async def run(app: Litestar) -> AsyncIterator[None]:
        await tenants.start()
        try:
            yield
        finally:
            await stop_step("the tenants' store", tenants.close())

    return run
