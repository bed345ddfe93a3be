"""Which key a caller is, cached per replica: by the hash of the key's material at the edge
(`authenticate`), and by id for work a key started that runs without its material (`resolve`: a batch's
lines). Bad tokens are kept from growing memory.

Only keys that exist are cached (and the `Bearer <key>` value that names each, so its next request skips
parsing and hashing). A token not in the keys' format is refused without a lookup, unless it is the
environment's admin key; a well-formed one that names no key is remembered by its hash only, in a small
table of its own. So anonymous traffic neither grows memory nor evicts the real keys' lookups.
`Tenants` (gateway/tenants/admission.py) drops the caches whenever the key store's version moves.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gateway.tenants import errors
from gateway.tenants.keys import KeyRecord, TeamRecord, bearer_token, hash_key
from gateway.tenants.prepared import Prepared
from gateway.tenants.store import TenantStore

_CACHE_MAX = 50_000
"""Keys that exist (cached lookups, and the `Authorization` values that name them)."""
_UNKNOWN_MAX = 4096
"""Hashes of well-formed tokens that name no key (a few hundred KB at most), so a client retrying a wrong
key costs no lookup per request."""
_KEY_FORMAT = re.compile(r"^sy-[A-Za-z0-9_-]{43}$")
"""What `keys.new_key_material` makes: `sy-` and 32 random bytes in URL-safe base64."""
_INCORRECT = "Incorrect API key provided."
ENV_ADMIN_ID = "admin"
"""The key id of the admin key from the environment (`auth.admin_key_env`)."""


@dataclass(slots=True)
class Tenant:
    key: KeyRecord
    team: TeamRecord | None
    admin: bool
    prepared: Prepared | None = None


def env_admin() -> Tenant:
    return Tenant(KeyRecord(id=ENV_ADMIN_ID, name="admin (environment)", scopes=["admin"]), None, True)


@dataclass(slots=True)
class _Cached:
    tenant: Tenant | None
    why: str = ""
    code: str = ""
    """Why the key cannot be used, for work run by key id: `key_revoked`, `key_not_found`."""


class KeyLookup:
    def __init__(self, store: TenantStore, admin_hash: str | None, timeout: float) -> None:
        self.store = store
        self.admin_hash = admin_hash
        self.timeout = timeout
        self._by_hash: dict[str, _Cached] = {}
        self._by_id: dict[str, _Cached] = {}
        self._pending: dict[str, asyncio.Future[_Cached]] = {}
        self._digests: dict[str, str] = {}
        """`Authorization: Bearer <key>` of keys that exist -> the key's hash."""
        self._unknown: set[str] = set()
        """Hashes of well-formed tokens the store does not know (`_UNKNOWN_MAX` at most)."""
        self._forgotten = 0
        """Times the caches were dropped: a lookup under way meanwhile may have read the key as it was,
        so its answer is not cached."""

    def forget(self) -> None:
        """A key or team changed: look every key up again."""
        self._by_hash.clear()
        self._by_id.clear()
        self._unknown.clear()
        self._forgotten += 1

    async def authenticate(self, authorization: str | None) -> Tenant:
        """The caller's tenant, or 401 `invalid_api_key` (no key, unknown, revoked, expired)."""
        digest = self._digests.get(authorization) if authorization else None
        canonical = False
        if digest is None:
            token = bearer_token(authorization)
            if token is None:
                raise errors.invalid_api_key(
                    "You didn't provide an API key. Send it as `Authorization: Bearer sy-...`."
                )
            digest = hash_key(token)
            if _KEY_FORMAT.match(token) is None and not self._is_admin(digest):
                raise errors.invalid_api_key(_INCORRECT)
            if digest in self._unknown:
                raise errors.invalid_api_key(_INCORRECT)
            canonical = len(authorization) == len(token) + 7  # type: ignore[arg-type]  # `Bearer <token>`
        cached = self._by_hash.get(digest)
        if cached is None:
            cached = await self._once("h:" + digest, lambda: self._lookup_hash(digest))
        tenant = cached.tenant
        if tenant is None:
            raise errors.invalid_api_key(cached.why)
        if canonical:  # one spelling per existing key (`Bearer` in any case, one space)
            if len(self._digests) >= _CACHE_MAX:
                self._digests.clear()
            self._digests[authorization] = digest  # type: ignore[index]
        expires = tenant.key.expires_at
        if expires is not None and time.time() >= expires:
            raise errors.invalid_api_key("This API key has expired.")
        return tenant

    async def resolve(self, key_id: str) -> Tenant:
        """The key `key_id` as it is now. Raises 401 `key_revoked`, `key_expired` or `key_not_found`, or
        503 `limits_unavailable` when the store cannot be read (nothing runs on a key not known good)."""
        cached = self._by_id.get(key_id)
        if cached is None:
            cached = await self._once("i:" + key_id, lambda: self._lookup_id(key_id))
        tenant = cached.tenant
        if tenant is None:
            raise errors.key_unusable(cached.code, cached.why)
        expires = tenant.key.expires_at
        if expires is not None and time.time() >= expires:
            raise errors.key_unusable("key_expired", f"The API key `{key_id}` has expired.")
        return tenant

    def _is_admin(self, digest: str) -> bool:
        return self.admin_hash is not None and hmac.compare_digest(digest, self.admin_hash)

    async def _once(self, name: str, lookup: Callable[[], Awaitable[_Cached]]) -> _Cached:
        """One lookup per key however many of its callers missed the cache at once."""
        pending = self._pending.get(name)
        if pending is None:
            pending = self._pending[name] = asyncio.ensure_future(lookup())
            pending.add_done_callback(lambda _: self._pending.pop(name, None))
        return await asyncio.shield(pending)

    async def _read(self, record: Awaitable[KeyRecord | None]) -> tuple[KeyRecord | None, TeamRecord | None]:
        """The key `record` reads and its team, within the timeout; 503 when the store cannot be read."""
        try:
            async with asyncio.timeout(self.timeout):
                key = await record
                team = await self.store.get_team(key.team) if key is not None else None
        except Exception as exc:
            raise errors.limits_unavailable(f"key store unreachable: {exc.__class__.__name__}") from None
        return key, team

    async def _lookup_hash(self, digest: str) -> _Cached:
        forgotten = self._forgotten
        if self._is_admin(digest):
            cached = _Cached(env_admin())
        else:
            key, team = await self._read(self.store.key_by_hash(digest))
            if key is None:
                unknown = self._unknown
                if forgotten == self._forgotten:
                    if len(unknown) >= _UNKNOWN_MAX:
                        unknown.clear()
                    unknown.add(digest)
                return _Cached(None, _INCORRECT)
            if key.revoked:
                cached = _Cached(None, "This API key has been revoked.")
            else:
                cached = _Cached(Tenant(key, team, "admin" in key.scopes))
        self._keep(self._by_hash, digest, cached, forgotten)
        return cached

    async def _lookup_id(self, key_id: str) -> _Cached:
        forgotten = self._forgotten
        if key_id == ENV_ADMIN_ID and self.admin_hash is not None:
            cached = _Cached(env_admin())
        else:
            key, team = await self._read(self.store.get_key(key_id))
            if key is None:
                cached = _Cached(None, f"The API key `{key_id}` does not exist.", "key_not_found")
            elif key.revoked:
                cached = _Cached(None, f"The API key `{key_id}` has been revoked.", "key_revoked")
            else:
                cached = _Cached(Tenant(key, team, "admin" in key.scopes))
        self._keep(self._by_id, key_id, cached, forgotten)
        return cached

    def _keep(self, cache: dict[str, _Cached], name: str, cached: _Cached, forgotten: int) -> None:
        if forgotten != self._forgotten:
            return
        if len(cache) >= _CACHE_MAX:
            cache.clear()
        cache[name] = cached
