"""The PROXY protocol parser, v1 and v2: what a balancer sends, and hostile input (truncated, oversized,
wrong signature, bad family, random bytes after a signature)."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.http.proxy_protocol import (
    ABSENT,
    MAX_V2_PAYLOAD,
    V2_SIGNATURE,
    ProxyHeader,
    ProxyHeaderError,
    read_header,
)

HTTP = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def v2(command: int = 0x21, family: int = 0x11, payload: bytes | None = None) -> bytes:
    if payload is None:
        if family == 0x21:
            payload = (
                socket.inet_pton(socket.AF_INET6, "2001:db8::7") + bytes(16) + struct.pack("!HH", 4321, 80)
            )
        else:
            payload = (
                socket.inet_aton("203.0.113.7") + socket.inet_aton("10.0.0.1") + struct.pack("!HH", 4321, 80)
            )
    return V2_SIGNATURE + bytes([command, family]) + struct.pack("!H", len(payload)) + payload


@pytest.mark.parametrize(
    ("header", "client"),
    [
        (b"PROXY TCP4 203.0.113.7 10.0.0.1 4321 80\r\n", ("203.0.113.7", 4321)),
        (b"PROXY TCP6 2001:db8::7 2001:db8::1 4321 80\r\n", ("2001:db8::7", 4321)),
        (b"PROXY TCP6 ::ffff:203.0.113.7 ::1 0 65535\r\n", ("203.0.113.7", 0)),
        (b"PROXY UNKNOWN\r\n", None),
        (b"PROXY UNKNOWN whatever the balancer likes\r\n", None),
        (v2(), ("203.0.113.7", 4321)),
        (v2(family=0x21), ("2001:db8::7", 4321)),
        (v2(command=0x20, family=0x00, payload=b""), None),  # LOCAL: a health check
        (v2(command=0x20, family=0x11), None),
        (v2(family=0x00, payload=b"\x00" * 5), None),  # UNSPEC
        (
            v2(
                payload=socket.inet_aton("203.0.113.7")
                + bytes(4)
                + struct.pack("!HH", 1, 2)
                + b"\x04\x00\x02ab"
            ),
            ("203.0.113.7", 1),
        ),  # a TLV after the addresses is skipped
    ],
)
def test_a_balancers_header_names_the_client(header: bytes, client: tuple[str, int] | None) -> None:
    assert read_header(header + HTTP) == ProxyHeader(len(header), client)
    for cut in range(len(header)):  # every truncation waits for more, never misreads
        assert read_header(header[:cut]) is None


@pytest.mark.parametrize(
    "data", [HTTP, b"POST /v1 HTTP/1.1\r\n", b"PUT", b"\x16\x03\x01", b"PROXX TCP4", b"\r\n\r\n\x01"]
)
def test_data_without_a_header_is_absent(data: bytes) -> None:
    assert read_header(data) is ABSENT


@pytest.mark.parametrize("data", [b"P", b"PRO", b"PROXY", b"\r", b"\r\n\r\n\x00\r\nQUI"])
def test_a_prefix_of_a_signature_waits(data: bytes) -> None:
    assert read_header(data) is None


@pytest.mark.parametrize(
    "data",
    [
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4321 80\n",  # LF without CR
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4321 80\rX\r\n",
        b"PROXY " + b"A" * 120,  # oversized: no CRLF within 107 bytes
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4321 80" + b" " * 80 + b"\r\n",
        b"PROXY TCP4  203.0.113.7 10.0.0.1 4321 80\r\n",  # two spaces
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4321\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 4321 80 9\r\n",
        b"PROXY TCP5 203.0.113.7 10.0.0.1 4321 80\r\n",
        b"PROXY tcp4 203.0.113.7 10.0.0.1 4321 80\r\n",
        b"PROXY TCP4 2001:db8::7 10.0.0.1 4321 80\r\n",  # address of the other family
        b"PROXY TCP6 203.0.113.7 ::1 4321 80\r\n",
        b"PROXY TCP4 203.0.113.07 10.0.0.1 4321 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 04321 80\r\n",  # leading zero
        b"PROXY TCP4 203.0.113.7 10.0.0.1 65536 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 -1 80\r\n",
        b"PROXY TCP4 203.0.113.7 10.0.0.1 +1 80\r\n",
        b"PROXY TCP6 fe80::1%eth0 ::1 1 80\r\n",
        "PROXY TCP4 203.0.113.7 10.0.0.1 \uff14 80\r\n".encode(),  # a fullwidth digit
        v2(command=0x31),  # version 3
        v2(command=0x22),  # unknown command
        v2(command=0x11),  # version 1 in a v2 signature
        v2(family=0x12),  # UDP over IPv4
        v2(family=0x22),
        v2(family=0x31),  # AF_UNIX
        v2(family=0x41),  # no such family
        v2(payload=bytes(11)),  # too short for IPv4 addresses
        v2(family=0x21, payload=bytes(35)),
        V2_SIGNATURE + b"\x21\x11" + struct.pack("!H", MAX_V2_PAYLOAD + 1),  # oversized
        V2_SIGNATURE + b"\x20\x00" + struct.pack("!H", 65535),
    ],
)
def test_a_malformed_header_is_an_error(data: bytes) -> None:
    with pytest.raises(ProxyHeaderError):
        read_header(data)


@given(st.binary(max_size=300))
def test_random_bytes_after_a_signature_never_misparse(tail: bytes) -> None:
    for signature in (V2_SIGNATURE, b"PROXY "):
        data = signature + tail
        try:
            header = read_header(data)
        except ProxyHeaderError:
            continue
        if header is not None:
            assert 0 < header.length <= len(data)
            assert header.client is None or 0 <= header.client[1] <= 65535
