"""The console's login session and its CSRF defences.

A session is an HMAC-signed token (`<expiry>.<nonce>.<mac>`) in a Secure, HttpOnly, SameSite=Strict
cookie. The signing secret is derived from the admin key's hash, so every replica that shares the admin
key accepts the same session and changing the admin key ends every session.

Logging out ends the session everywhere: its nonce (the session id) is written to `Revocations` until the
token would expire anyway, in Redis when the key store has one (every replica reads it on each console
request), always in this process's memory too. Without Redis (one replica) memory is the whole truth.
While Redis is unreachable the console refuses every session (fail closed: a revoked session must not
come back); the admin API with the bearer key keeps working.

Every action (a POST) needs two things: the session's CSRF token (derived from the session nonce, sent
in the `x-csrf-token` header or a `csrf` form field) and an `Origin` (or, without one, a `Referer`)
naming this host. The login form, which has no session yet, needs the Origin check.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from litestar import Request

from gateway.redis.client import REDIS_ERRORS, AnyRedis

log = logging.getLogger("switchyard.console")

COOKIE = "sy_console"
SESSION_SECONDS = 8 * 3600
CSRF_HEADER = "x-csrf-token"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Revocations:
    """Session ids ended by a logout, each kept until its session would have expired anyway.

    Memory holds what this replica ended (one entry per logout: bounded by the admin's logouts within a
    session's lifetime, expired ones dropped as new ones come); Redis, when given, what any replica ended.
    """

    def __init__(self, client: AnyRedis | None = None, namespace: str = "", timeout_s: float = 0.5) -> None:
        self._client = client
        self._prefix = f"{namespace}:console:ended:"
        self._timeout_s = timeout_s
        self._local: dict[str, float] = {}

    async def revoke(self, session_id: str, expiry: float) -> None:
        """Raises (a Redis error) when the other replicas could not be told; this one refuses it anyway."""
        now = time.time()
        if len(self._local) >= 1024:
            self._local = {sid: until for sid, until in self._local.items() if until > now}
        self._local[session_id] = expiry
        if self._client is not None and expiry > now:
            async with asyncio.timeout(self._timeout_s):
                await self._client.set(self._prefix + session_id, b"1", px=int((expiry - now) * 1000) + 1)

    async def revoked(self, session_id: str) -> bool:
        """Whether the session was ended; True too when Redis cannot say (fail closed)."""
        if session_id in self._local:
            return True
        if self._client is None:
            return False
        try:
            async with asyncio.timeout(self._timeout_s):
                return bool(await self._client.exists(self._prefix + session_id))
        except (TimeoutError, *REDIS_ERRORS) as exc:
            log.warning("console: cannot read the ended sessions from Redis (%s); session refused", exc)
            return True


class Sessions:
    """Issues and checks console sessions for one admin key (its SHA-256 hex, as `Tenants` keeps it)."""

    def __init__(
        self, admin_hash: str, lifetime_s: float = SESSION_SECONDS, revocations: Revocations | None = None
    ) -> None:
        self.admin_hash = admin_hash
        self.lifetime_s = lifetime_s
        self.revocations = revocations or Revocations()
        self._secret = hmac.new(bytes.fromhex(admin_hash), b"switchyard console session", "sha256").digest()

    def _mac(self, message: str) -> str:
        return _b64(hmac.new(self._secret, message.encode("ascii"), "sha256").digest())

    def is_admin_key(self, material: str) -> bool:
        digest = hashlib.sha256(material.encode("utf-8")).hexdigest()
        return hmac.compare_digest(digest, self.admin_hash)

    def issue(self, now: float | None = None) -> str:
        expiry = int((now if now is not None else time.time()) + self.lifetime_s)
        body = f"{expiry}.{_b64(os.urandom(18))}"
        return f"{body}.{self._mac(body)}"

    def valid(self, token: str | None, now: float | None = None) -> bool:
        if not token or token.count(".") != 2:
            return False
        body, _, mac = token.rpartition(".")
        if not hmac.compare_digest(mac, self._mac(body)):
            return False
        expiry = body.partition(".")[0]
        return expiry.isdigit() and int(expiry) > (now if now is not None else time.time())

    async def live(self, token: str | None) -> bool:
        """Signed, not expired, and not ended by a logout on any replica."""
        return self.valid(token) and not await self.revocations.revoked(_session_id(token or ""))

    async def end(self, token: str) -> None:
        """Log the session out everywhere (raises when Redis could not be told)."""
        if self.valid(token):
            await self.revocations.revoke(_session_id(token), float(token.partition(".")[0]))

    def csrf_token(self, session: str) -> str:
        return self._mac("csrf:" + session.partition(".")[2].partition(".")[0])

    def csrf_ok(self, session: str, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given or "", self.csrf_token(session))

    def cookie_header(self, token: str) -> str:
        return (
            f"{COOKIE}={token}; Max-Age={int(self.lifetime_s)}; Path=/console; Secure; HttpOnly; "
            "SameSite=Strict"
        )


def _session_id(token: str) -> str:
    return token.partition(".")[2].partition(".")[0]


def cleared_cookie_header() -> str:
    return f"{COOKIE}=; Max-Age=0; Path=/console; Secure; HttpOnly; SameSite=Strict"


def same_origin(request: Request[Any, Any, Any]) -> bool:
    """The request comes from a page of this host: its Origin, or else its Referer, names the Host it
    was sent to. Neither header: refused (browsers send Origin on every POST)."""
    host = request.headers.get("host")
    if not host:
        return False
    origin = request.headers.get("origin")
    source = origin if origin and origin != "null" else request.headers.get("referer")
    if not source:
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()
