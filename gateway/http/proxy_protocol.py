"""The PROXY protocol (HAProxy's `send-proxy` / `send-proxy-v2`): the header a balancer writes before the
first HTTP byte of a connection, naming the client it relays.

Parsed strictly, because only a trusted balancer may send one and anything else in its place is a fault:
v1 is one US-ASCII line of at most 107 bytes (`PROXY TCP4|TCP6|UNKNOWN src dst sport dport\\r\\n`, single
spaces, addresses of the named family, ports without leading zeros); v2 is the 12-byte signature, version
2, command LOCAL or PROXY, a TCP-over-IPv4/IPv6 (or, for LOCAL and UNSPEC, any) family and a length that
covers the addresses, at most `MAX_V2_PAYLOAD` bytes of addresses plus TLVs (skipped). LOCAL (a balancer's
own health check), v1 UNKNOWN and v2 UNSPEC name no client: the connection's own peer is the client.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

V2_SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"
V1_PREFIX = b"PROXY "
V1_MAX_LINE = 107
MAX_V2_PAYLOAD = 2048
"""Addresses plus TLVs; HAProxy sends 12 (IPv4) or 36 (IPv6) plus a few optional TLVs."""

_V2_HEADER = struct.Struct("!12sBBH")
_TCP4, _TCP6, _UNSPEC = 0x11, 0x21, 0x00
_LOCAL, _PROXY = 0x20, 0x21


class ProxyHeaderError(ValueError):
    """The connection began with a PROXY signature but not with a valid header."""


@dataclass(frozen=True, slots=True)
class ProxyHeader:
    length: int
    """Bytes the header took (0: the data does not begin with a PROXY header)."""
    client: tuple[str, int] | None
    """The relayed client's address and port; None when the header names none (LOCAL, UNKNOWN, UNSPEC)."""


ABSENT = ProxyHeader(0, None)
_V1_FAMILIES: dict[bytes, type[ipaddress.IPv4Address] | type[ipaddress.IPv6Address]] = {
    b"TCP4": ipaddress.IPv4Address,
    b"TCP6": ipaddress.IPv6Address,
}


def read_header(data: bytes) -> ProxyHeader | None:
    """The PROXY header `data` begins with, `ABSENT` if it begins with none, None if more bytes are needed
    to tell; raises ProxyHeaderError for a malformed one."""
    if data.startswith(V2_SIGNATURE):
        return _read_v2(data)
    if data.startswith(V1_PREFIX):
        return _read_v1(data)
    if V2_SIGNATURE.startswith(data[:12]) or V1_PREFIX.startswith(data[:6]):
        return None  # a prefix of a signature: wait for more
    return ABSENT


def _read_v1(data: bytes) -> ProxyHeader | None:
    end = data.find(b"\r\n", 0, V1_MAX_LINE)
    if end < 0:
        head = data[:V1_MAX_LINE]
        if len(data) >= V1_MAX_LINE or b"\n" in head or b"\r" in head[:-1]:
            raise ProxyHeaderError("PROXY v1 line without CRLF within 107 bytes")
        return None
    line = data[len(V1_PREFIX) : end]
    if not line.isascii():
        raise ProxyHeaderError("PROXY v1 line is not ASCII")
    fields = line.split(b" ")
    if fields[0] == b"UNKNOWN":
        return ProxyHeader(end + 2, None)
    if len(fields) != 5:
        raise ProxyHeaderError("PROXY v1 line needs protocol, two addresses and two ports")
    protocol, source, destination, source_port, destination_port = fields
    family = _V1_FAMILIES.get(protocol)
    if family is None:
        raise ProxyHeaderError("PROXY v1 protocol must be TCP4, TCP6 or UNKNOWN")
    try:
        if b"%" in source or b"%" in destination:
            raise ValueError("a scope id")
        address = family(source.decode())
        family(destination.decode())
    except ValueError:
        raise ProxyHeaderError("PROXY v1 address does not match its protocol") from None
    port = _v1_port(source_port)
    _v1_port(destination_port)
    return ProxyHeader(end + 2, (_host(address), port))


def _v1_port(text: bytes) -> int:
    if not text.isdigit() or len(text) > 5 or (len(text) > 1 and text.startswith(b"0")):
        raise ProxyHeaderError("PROXY v1 port is not a decimal number without leading zeros")
    port = int(text)
    if port > 65535:
        raise ProxyHeaderError("PROXY v1 port is past 65535")
    return port


def _read_v2(data: bytes) -> ProxyHeader | None:
    if len(data) < _V2_HEADER.size:
        return None
    _, version_command, family, length = _V2_HEADER.unpack_from(data)
    if version_command not in (_LOCAL, _PROXY):
        raise ProxyHeaderError("PROXY v2 version must be 2 and the command LOCAL or PROXY")
    if length > MAX_V2_PAYLOAD:
        raise ProxyHeaderError(f"PROXY v2 header longer than {MAX_V2_PAYLOAD} bytes")
    total = _V2_HEADER.size + length
    if version_command == _LOCAL:
        if len(data) < total:
            return None
        return ProxyHeader(total, None)
    if family == _UNSPEC:
        client = None
        needed = 0
    elif family == _TCP4:
        needed = 12
    elif family == _TCP6:
        needed = 36
    else:
        raise ProxyHeaderError("PROXY v2 family must be TCP over IPv4 or IPv6 (or UNSPEC)")
    if length < needed:
        raise ProxyHeaderError("PROXY v2 length does not cover the addresses")
    if len(data) < total:
        return None
    body = data[_V2_HEADER.size : total]
    if family == _TCP4:
        client = (_host(ipaddress.IPv4Address(body[0:4])), int.from_bytes(body[8:10], "big"))
    elif family == _TCP6:
        client = (_host(ipaddress.IPv6Address(body[0:16])), int.from_bytes(body[32:34], "big"))
    return ProxyHeader(total, client)


def _host(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    """The address as a socket names it; an IPv4-mapped IPv6 address as its IPv4 one."""
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped) if mapped is not None else address.compressed
