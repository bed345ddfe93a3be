"""The key and team model: what a key may do, and the key material (shown once, stored as a hash).

Key material is `sy-` plus 32 random bytes (256 bits) in URL-safe base64. A key that random cannot be
guessed or brute-forced from its hash, so a plain SHA-256 is the right stored form (a slow password hash
buys nothing for high-entropy secrets and would cost milliseconds per cache miss).
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from typing import Annotated, Literal

import msgspec

KEY_PREFIX = "sy-"
Period = Literal["day", "week", "month", "total"]
Priority = Literal["high", "normal", "low"]
Scope = Literal["admin"]

PRIORITY_RANK = {"high": 0, "normal": 1, "": 1, "low": 2, "batch": 2}
"""Lower is more urgent; the same order the back-pressure queue serves (gateway/request/backpressure.py)."""

_Name = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9._:@-]{1,64}$")]
_Count = Annotated[int, msgspec.Meta(ge=1)]
_Usd = Annotated[float, msgspec.Meta(ge=0)]
_Quota = Annotated[int, msgspec.Meta(ge=0)]
_Bytes = Annotated[int, msgspec.Meta(ge=1)]


class Limits(msgspec.Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """What a key or a team may use; None is unlimited. A request must fit its key's and its team's."""

    rpm: _Count | None = None
    tpm: _Count | None = None
    """Tokens per window: the prompt plus `max_tokens` are reserved at admission, settled to actual use."""
    max_parallel: _Count | None = None
    budget_usd: _Usd | None = None
    budget_period: Period = "month"


class TeamRecord(Limits, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    name: _Name


class KeyRecord(Limits, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    id: str
    """Random, public: names the key in usage, logs and the admin API. Never derived from the material."""
    name: str = ""
    team: _Name = "default"
    models: list[str] = []
    """Models the key may use; empty: every model."""
    max_priority: Priority = "normal"
    """The highest `x-switchyard-priority` honoured; a higher hint is ignored."""
    classes: list[str] = []
    """Classes the key may ask for with `x-switchyard-class`; empty: any."""
    expires_at: float | None = None
    """Unix time after which the key is refused."""
    metadata: dict[str, str] = {}
    scopes: list[Scope] = []
    max_file_bytes: _Bytes | None = None
    """The largest upload; None: `batches.max_file_bytes` (which also caps this)."""
    max_stored_files: _Quota | None = None
    """Files the key may hold at once; None: `batches.max_stored_files`."""
    max_stored_bytes: _Quota | None = None
    """Bytes of files the key may hold at once; None: `batches.max_stored_bytes`."""
    max_open_batches: _Quota | None = None
    """Batches the key may have open at once; None: `batches.max_open_batches`."""
    revoked: bool = False
    created_at: float = 0.0
    hash: str = ""
    """SHA-256 of the key material (hex); the material itself is never stored."""

    def public(self) -> dict[str, object]:
        """The record as the admin API shows it: everything but the hash."""
        data = msgspec.to_builtins(self)
        data.pop("hash", None)
        return data

    def usable(self, now: float) -> str | None:
        """Why the key cannot be used now, or None."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "expired"
        return None


class KeyFields(Limits, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """The body of create and update (`POST /admin/v1/keys`, `PATCH /admin/v1/keys/{id}`)."""

    name: str | None = None
    team: _Name | None = None
    models: list[str] | None = None
    max_priority: Priority | None = None
    classes: list[str] | None = None
    expires_at: float | None = None
    metadata: dict[str, str] | None = None
    scopes: list[Scope] | None = None
    max_file_bytes: _Bytes | None = None
    max_stored_files: _Quota | None = None
    max_stored_bytes: _Quota | None = None
    max_open_batches: _Quota | None = None


_LIMIT_FIELDS = ("rpm", "tpm", "max_parallel", "budget_usd", "budget_period")


def apply_fields(record: KeyRecord, fields: KeyFields, given: set[str]) -> KeyRecord:
    """`record` with the fields the client sent (`given`: names present in the body; null clears a limit)."""
    changes = {name: getattr(fields, name) for name in given}
    for name in ("name", "team", "models", "max_priority", "classes", "metadata", "scopes"):
        if name in changes and changes[name] is None:
            del changes[name]
    return msgspec.structs.replace(record, **changes)


def new_key_material() -> str:
    return KEY_PREFIX + base64.urlsafe_b64encode(os.urandom(32)).rstrip(b"=").decode("ascii")


def hash_key(material: str) -> str:
    return hashlib.sha256(material.encode("utf-8")).hexdigest()


def new_key_id() -> str:
    return "key_" + os.urandom(8).hex()


def new_key(fields: KeyFields, given: set[str]) -> tuple[str, KeyRecord]:
    """(material, record): the material is returned to the caller once and then forgotten."""
    material = new_key_material()
    record = KeyRecord(id=new_key_id(), created_at=time.time(), hash=hash_key(material))
    return material, apply_fields(record, fields, given)


def bearer_token(authorization: str | None) -> str | None:
    if not authorization:
        return None
    scheme, _, credentials = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = credentials.strip()
    return token or None


def limit_fields() -> tuple[str, ...]:
    return _LIMIT_FIELDS
