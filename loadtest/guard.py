"""Only loopback targets: the load generator refuses any URL that could leave this machine."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


class NotLoopbackError(ValueError):
    """The URL names a host that is not a loopback address."""


def require_loopback(url: str) -> str:
    """`url` unchanged if it is http(s) to 127.0.0.0/8, ::1 or `localhost`; raises NotLoopbackError."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise NotLoopbackError(f"only http(s) URLs can be load-tested, got {url!r}")
    host = parts.hostname or ""
    if host == "localhost":
        return url
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise NotLoopbackError(f"{url!r}: give a loopback IP address, not the name {host!r}") from None
    if not address.is_loopback:
        raise NotLoopbackError(f"{url!r} is not a loopback address; load tests only target this machine")
    return url
