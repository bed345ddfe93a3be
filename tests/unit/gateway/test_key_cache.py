"""The key lookup cache holds only keys that exist: bad tokens neither grow it nor evict the real keys."""

from __future__ import annotations

import asyncio
import os

import pytest

from gateway.config.settings import AuthOptions, LedgerOptions
from gateway.ledger.factory import build_ledger
from gateway.openai.errors import GatewayError
from gateway.tenants import key_lookup
from gateway.tenants.admission import Tenants
from gateway.tenants.keys import KeyFields, hash_key, new_key, new_key_material
from gateway.tenants.store_memory import MemoryTenantStore

ADMIN = "any text at all, not the keys' format"


class CountingStore(MemoryTenantStore):
    """The memory store, counting the lookups by hash it answers."""

    def __init__(self) -> None:
        super().__init__()
        self.lookups = 0

    async def key_by_hash(self, digest: str):  # type: ignore[no-untyped-def]
        self.lookups += 1
        return await super().key_by_hash(digest)


def _tenants(store: CountingStore) -> Tenants:
    options = AuthOptions(mode="keys")
    return Tenants(
        options, store, build_ledger(LedgerOptions(store="memory"), []), "t", None, hash_key(ADMIN)
    )


async def _refused(tenants: Tenants, authorization: str) -> str:
    with pytest.raises(GatewayError) as refused:
        await tenants.authenticate(authorization)
    assert refused.value.status == 401
    return refused.value.body.code or ""


def test_bad_tokens_are_not_cached_and_do_not_evict_a_real_keys_lookup() -> None:
    async def run() -> None:
        store = CountingStore()
        material, record = new_key(KeyFields(name="real"), {"name"})
        await store.put_key(record)
        tenants = _tenants(store)
        real = f"Bearer {material}"
        assert (await tenants.authenticate(real)).key.id == record.id
        cached = tenants.keys._by_hash[record.hash]
        assert store.lookups == 1

        for i in range(20_000):  # malformed: any text, up to kilobytes
            assert await _refused(tenants, f"Bearer junk-{i}-" + "x" * (i % 4000)) == "invalid_api_key"
        assert store.lookups == 1  # refused without a lookup
        for _ in range(2 * key_lookup._UNKNOWN_MAX + 10):  # well-formed, unknown
            await _refused(tenants, f"Bearer {new_key_material()}")
        assert store.lookups == 1 + 2 * key_lookup._UNKNOWN_MAX + 10

        assert set(tenants.keys._by_hash) == {record.hash} and tenants.keys._by_hash[record.hash] is cached
        assert list(tenants.keys._digests) == [real]
        assert len(tenants.keys._unknown) <= key_lookup._UNKNOWN_MAX
        assert (await tenants.authenticate(real)).key.id == record.id
        assert store.lookups == 1 + 2 * key_lookup._UNKNOWN_MAX + 10  # still cached: no new lookup

    asyncio.run(run())


def test_a_wrong_key_retried_costs_one_lookup_and_a_new_key_is_found_at_once() -> None:
    async def run() -> None:
        store = CountingStore()
        tenants = _tenants(store)
        wrong = f"Bearer {new_key_material()}"
        for _ in range(5):
            await _refused(tenants, wrong)
        assert store.lookups == 1
        material, record = new_key(KeyFields(), set())
        tenants.changed(await store.put_key(record))
        assert (await tenants.authenticate(f"Bearer {material}")).key.id == record.id

    asyncio.run(run())


def test_the_environments_admin_key_may_be_any_text_and_spellings_of_a_key_are_not_kept() -> None:
    async def run() -> None:
        store = CountingStore()
        tenants = _tenants(store)
        assert (await tenants.authenticate(f"Bearer {ADMIN}")).admin
        material, record = new_key(KeyFields(), set())
        await store.put_key(record)
        for spaces in range(1, 50):
            tenant = await tenants.authenticate("Bearer" + " " * spaces + material + " " * spaces)
            assert tenant.key.id == record.id
        assert len(tenants.keys._digests) <= 1
        assert set(tenants.keys._by_hash) == {hash_key(ADMIN), record.hash}
        assert await _refused(tenants, "Bearer sy-" + os.urandom(8).hex()) == "invalid_api_key"

    asyncio.run(run())
