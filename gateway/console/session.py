"""The console's login session and its CSRF defences.

A session is an HMAC-signed token (`<expiry>.<nonce>.<mac>`) in a Secure, HttpOnly, SameSite=Strict
cookie. The signing secret is derived from the admin key's hash, so every replica that shares the admin
key accepts the same session (no session store to share) and changing the admin key ends every session.

Every action (a POST) needs two things: the session's CSRF token (derived from the session nonce, sent
in the `x-csrf-token` header or a `csrf` form field) and an `Origin` (or, without one, a `Referer`)
naming this host. The login form, which has no session yet, needs the Origin check.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from typing import Any
from urllib.parse import urlsplit

from litestar import Request

COOKIE = "sy_console"
SESSION_SECONDS = 8 * 3600
CSRF_HEADER = "x-csrf-token"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


class Sessions:
    """Issues and checks console sessions for one admin key (its SHA-256 hex, as `Tenants` keeps it)."""

    def __init__(self, admin_hash: str, lifetime_s: float = SESSION_SECONDS) -> None:
        self.admin_hash = admin_hash
        self.lifetime_s = lifetime_s
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

    def csrf_token(self, session: str) -> str:
        return self._mac("csrf:" + session.partition(".")[2].partition(".")[0])

    def csrf_ok(self, session: str, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given or "", self.csrf_token(session))

    def cookie_header(self, token: str) -> str:
        return (
            f"{COOKIE}={token}; Max-Age={int(self.lifetime_s)}; Path=/console; Secure; HttpOnly; "
            "SameSite=Strict"
        )


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
