"""Trusted balancers and X-Forwarded-For: only a trusted hop's word is taken, read from the right."""

from __future__ import annotations

import pytest

from gateway.http.client_address import TrustedProxies

TRUSTED = TrustedProxies(["127.0.0.1/32", "10.0.0.0/8", "2001:db8::/32"])


@pytest.mark.parametrize(
    ("host", "trusted"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", False),
        ("10.200.3.4", True),
        ("11.0.0.1", False),
        ("2001:db8::9", True),
        ("::ffff:10.1.2.3", True),  # IPv4-mapped, as a dual-stack socket names it
        ("", False),
        ("not-an-address", False),
    ],
)
def test_trusts(host: str, trusted: bool) -> None:
    assert TRUSTED.trusts(host) is trusted


@pytest.mark.parametrize(
    ("values", "client"),
    [
        ([b"203.0.113.7"], "203.0.113.7"),
        ([b"203.0.113.7, 10.0.0.5"], "203.0.113.7"),  # an inner balancer appended its own hop
        ([b"6.6.6.6, 203.0.113.7"], "203.0.113.7"),  # what the client wrote itself is not believed
        ([b"6.6.6.6", b"203.0.113.7"], "203.0.113.7"),  # two headers are one list
        ([b"10.0.0.9, 10.0.0.5"], "10.0.0.9"),  # every hop trusted: the first
        ([b"garbage, 203.0.113.7"], "203.0.113.7"),
        ([b"203.0.113.7, garbage"], "127.0.0.1"),  # a malformed last entry: the peer
        ([b"203.0.113.7, garbage, 10.0.0.5"], "10.0.0.5"),
        ([b""], "127.0.0.1"),
        ([b" 2001:db9::1 "], "2001:db9::1"),
    ],
)
def test_forwarded_client(values: list[bytes], client: str) -> None:
    assert TRUSTED.forwarded_client(values, "127.0.0.1") == client


def test_no_networks_is_falsy() -> None:
    assert not TrustedProxies([]) and TRUSTED
