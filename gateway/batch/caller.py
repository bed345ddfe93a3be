"""Who calls the batch API: the owner its files and batches are recorded under, and its key's limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from litestar.connection import ASGIConnection

from gateway.batch.service import BatchService
from gateway.request.classify import key_id
from gateway.tenants.keys import KeyRecord


@dataclass(frozen=True, slots=True)
class Caller:
    owner: str
    """The key id (`auth.mode: keys`), else a digest of the caller's Authorization."""
    key: KeyRecord | None
    """The caller's key (keys mode); its quota fields override the config's."""
    admin: bool
    authorization: str | None
    """Open mode only: the caller's Authorization, so a batch's lines carry the same key in the ledger."""


async def caller_of(service: BatchService, request: ASGIConnection[Any, Any, Any, Any]) -> Caller:
    """The caller; in keys mode a missing, unknown, revoked or expired key is 401 `invalid_api_key`."""
    authorization = request.headers.get("authorization")
    tenants = service.tenants
    if service.keys_mode and tenants is not None:
        tenant = await tenants.authenticate(authorization)
        return Caller(tenant.key.id, tenant.key, tenant.admin, None)
    return Caller(key_id(authorization), None, False, authorization)
