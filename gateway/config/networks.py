"""Network addresses in the config (`gateway.trusted_proxies`): parsed once at load, used per connection."""

from __future__ import annotations

import ipaddress

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def parse_network(text: str) -> Network:
    """A CIDR (`10.0.0.0/8`) or one address (`10.1.2.3`, a /32 or /128); ValueError says what is wrong,
    host bits set included (`10.0.0.1/8` is a typo for something)."""
    return ipaddress.ip_network(text.strip(), strict=True)
