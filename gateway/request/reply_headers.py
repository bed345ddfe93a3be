"""An answer's headers: the request's own, and those of its backend, pool, vendor, route and class.

The second kind takes a handful of values, the same for many requests: each combination is encoded once
and handed over as the same tuple every time (`Fixed`), so the HTTP layer checks and joins it once too
(gateway/http/response_write.py)."""

from __future__ import annotations

from backends.models import Backend
from gateway.request.context import RequestContext

Fixed = tuple[tuple[bytes, bytes], ...]
"""Headers as ASGI carries them, the same object for the same values."""

_NAMES = ("x-switchyard-backend", "x-switchyard-pool", "x-switchyard-vendor", "x-switchyard-route")
_CLASS = "x-switchyard-class"
_FIXED: dict[tuple[str, str, str, str, str], Fixed] = {}
_KEPT = 1024


_IDS = "x-request-id: %s\r\nx-switchyard-request-id: %s\r\n"


def reply_headers(ctx: RequestContext, backend: Backend) -> tuple[dict[str, str], Fixed, bytes]:
    """The request's own headers (a dict), the backend's and route's (`Fixed`), and the request ids as the
    head's lines (`name: value\r\n` each, sent unchecked): the gateway's id is its own (`req-` and hex)
    and a client's `x-request-id` is echoed only when it passed `valid_request_id` (gateway/http/routes.py:
    letters, digits and `._:-`), else the gateway's is sent in its place."""
    caller = ctx.caller
    own = caller.request_id
    lines = (_IDS % (caller.client_request_id or own, own)).encode()
    headers: dict[str, str] = {}
    if ctx.attempts > 1:
        headers["x-switchyard-attempts"] = str(ctx.attempts)
    pool = backend.pool
    key = (backend.name, pool.name, pool.vendor, ctx.decision.route, ctx.profile.request_class)
    fixed = _FIXED.get(key)
    if fixed is None:
        names = (*_NAMES, _CLASS)
        try:
            fixed = tuple(
                (name.encode(), value.encode("latin-1")) for name, value in zip(names, key, strict=True)
            )
        except UnicodeEncodeError:  # sent as before, where it fails the same way
            headers.update(zip(names, key, strict=True))
            return headers, (), lines
        if len(_FIXED) < _KEPT:
            _FIXED[key] = fixed
    return headers, fixed, lines
