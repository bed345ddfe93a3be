"""Who the client is behind a balancer: `gateway.trusted_proxies` (CIDRs) and X-Forwarded-For.

Only a connection from a trusted address may name another client (a PROXY header,
gateway/http/proxy_protocol.py, or X-Forwarded-For); from anywhere else the connection's own peer is
the client. X-Forwarded-For is read from the right, as each proxy appends the address it saw: the first
entry that is not itself a trusted proxy is the client (so a client cannot pick its address by sending
the header itself); a malformed entry stops the walk at the last good one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from gateway.config.networks import parse_network

_Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_CACHE_MAX = 4096


def _address(text: str) -> _Address | None:
    try:
        address = ipaddress.ip_address(text.strip())
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped if mapped is not None else address


class TrustedProxies:
    def __init__(self, networks: Iterable[str]) -> None:
        self.networks = tuple(parse_network(n) for n in networks)
        self._known: dict[str, bool] = {}

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts(self, host: str) -> bool:
        known = self._known.get(host)
        if known is None:
            address = _address(host)
            known = address is not None and any(address in network for network in self.networks)
            if len(self._known) >= _CACHE_MAX:
                self._known.clear()
            self._known[host] = known
        return known

    def forwarded_client(self, values: list[bytes], peer: str) -> str:
        """The client named by the X-Forwarded-For header values (in order) of a request from a trusted
        `peer`; the peer itself when there is no usable entry."""
        client = peer
        entries = b",".join(values).split(b",")
        for raw in reversed(entries):
            address = _address(raw.decode("latin-1"))
            if address is None:
                break
            client = str(address)
            if not self.trusts(client):
                break
        return client
