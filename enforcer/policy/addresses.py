"""Address classification for `deny_private`: which IP addresses an agent must never reach.

Embedded IPv4 forms (IPv4-mapped, IPv4-compatible, NAT64 64:ff9b::/96, 6to4 2002::/16, Teredo)
are unwrapped and classified as the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

PUBLIC = "public"
_METADATA = {
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254", "192.0.0.192")
}
_RANGES: list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]] = [
    (cls, ipaddress.ip_network(net))
    for cls, net in (
        ("unspecified", "0.0.0.0/8"),
        ("loopback", "127.0.0.0/8"),
        ("private", "10.0.0.0/8"),
        ("private", "172.16.0.0/12"),
        ("private", "192.168.0.0/16"),
        ("cgnat", "100.64.0.0/10"),
        ("link_local", "169.254.0.0/16"),
        ("reserved", "192.0.0.0/24"),
        ("documentation", "192.0.2.0/24"),
        ("benchmark", "198.18.0.0/15"),
        ("documentation", "198.51.100.0/24"),
        ("documentation", "203.0.113.0/24"),
        ("multicast", "224.0.0.0/4"),
        ("reserved", "240.0.0.0/4"),
        ("unspecified", "::/128"),
        ("loopback", "::1/128"),
        ("ula", "fc00::/7"),
        ("link_local", "fe80::/10"),
        ("site_local", "fec0::/10"),
        ("multicast", "ff00::/8"),
        ("documentation", "2001:db8::/32"),
        ("discard", "100::/64"),
        ("reserved", "2001::/23"),
    )
]


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped:
        return address.ipv4_mapped
    if address.sixtofour:
        return address.sixtofour
    if address.teredo:
        return address.teredo[1]
    packed = address.packed
    if packed[:12] == bytes(12) and int(address) > 1:  # IPv4-compatible ::a.b.c.d (deprecated)
        return ipaddress.IPv4Address(packed[12:])
    if address in ipaddress.ip_network("64:ff9b::/96") or address in ipaddress.ip_network("64:ff9b:1::/48"):
        return ipaddress.IPv4Address(packed[12:])
    return None


def classify(
    address: str | IPAddress,
    own_addresses: Iterable[IPAddress] = (),
    public_test_ranges: Iterable[ipaddress.IPv4Network | ipaddress.IPv6Network] = (),
) -> str:
    """One class name: public, loopback, private, cgnat, link_local, metadata, ula, multicast, ... ."""
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    inner = embedded_ipv4(ip)
    if inner is not None:
        return classify(inner, own_addresses, public_test_ranges)
    if ip in _METADATA:
        return "metadata"
    if ip in set(own_addresses):
        return "host_own"
    for network in public_test_ranges:
        if ip.version == network.version and ip in network:
            return PUBLIC
    for cls, network in _RANGES:
        if ip.version == network.version and ip in network:
            return cls
    if not ip.is_global:
        return "reserved"
    return PUBLIC
