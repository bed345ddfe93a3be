"""Who an `Authorization` header is: key lookups cached per replica, bad tokens kept from growing memory.

Only keys that exist are cached (and the `Bearer <key>` value that names each, so its next request skips
parsing and hashing). A token not in the keys' format is refused without a lookup, unless it is the
environment's admin key; a well-formed one that names no key is remembered by its hash only, in a small
table of its own. So anonymous traffic neither grows memory nor evicts the real keys' lookups.
`Tenants` (gateway/tenants/admission.py) drops the cache when the store's version changes.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
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


@dataclass(slots=True)
class Tenant:
    key: KeyRecord
    team: TeamRecord | None
    admin: bool
    prepared: Prepared | None = None


@dataclass(slots=True)
class _Cached:
    tenant: Tenant | None
    why: str = ""


class KeyLookup:
    def __init__(self, store: TenantStore, admin_hash: str | None, timeout: float) -> None:
        self.store = store
        self.admin_hash = admin_hash
        self.timeout = timeout
        self._cache: dict[str, _Cached] = {}
        self._lookups: dict[str, asyncio.Future[_Cached]] = {}
        self._digests: dict[str, str] = {}
        """`Authorization: Bearer <key>` of keys that exist -> the key's hash."""
        self._unknown: set[str] = set()
        """Hashes of well-formed tokens the store does not know (`_UNKNOWN_MAX` at most)."""

    def forget(self) -> None:
        """A key or team changed: look every key up again."""
        self._cache.clear()
        self._unknown.clear()

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
        cached = self._cache.get(digest)
        if cached is None:
            # One lookup per key however many of its requests missed the cache at once.
            pending = self._lookups.get(digest)
            if pending is None:
                pending = self._lookups[digest] = asyncio.ensure_future(self._lookup(digest))
                pending.add_done_callback(lambda _: self._lookups.pop(digest, None))
            cached = await asyncio.shield(pending)
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

    def _is_admin(self, digest: str) -> bool:
        return self.admin_hash is not None and hmac.compare_digest(digest, self.admin_hash)

    async def _lookup(self, digest: str) -> _Cached:
        if self._is_admin(digest):
            cached = _Cached(
                Tenant(KeyRecord(id="admin", name="admin (environment)", scopes=["admin"]), None, True)
            )
        else:
            try:
                async with asyncio.timeout(self.timeout):
                    key = await self.store.key_by_hash(digest)
                    team = await self.store.get_team(key.team) if key is not None else None
            except Exception as exc:
                raise errors.limits_unavailable(f"key store unreachable: {exc.__class__.__name__}") from None
            if key is None:
                unknown = self._unknown
                if len(unknown) >= _UNKNOWN_MAX:
                    unknown.clear()
                unknown.add(digest)
                return _Cached(None, _INCORRECT)
            if key.revoked:
                cached = _Cached(None, "This API key has been revoked.")
            else:
                cached = _Cached(Tenant(key, team, "admin" in key.scopes))
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[digest] = cached
        return cached
