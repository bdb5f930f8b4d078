"""The operator's region map: host patterns and address ranges to regions (EU, US, UK, APAC, ...).

Parsed from plain data (the caller reads policies/regions.yaml); lookups are pure.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import field
from typing import Any

from ..quick_dataclass import dataclass
from .patterns import PatternError, PatternList

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class RegionMapError(ValueError):
    pass


@dataclass(frozen=True)
class RegionMap:
    host_rules: tuple[tuple[PatternList, str], ...] = ()
    networks: tuple[tuple[Network, str], ...] = ()
    digest: str = field(default="")

    @classmethod
    def empty(cls) -> RegionMap:
        return cls((), (), hashlib.sha256(b"{}").hexdigest())

    @classmethod
    def from_data(cls, data: Any) -> RegionMap:
        """{"regions": {"EU": {"hosts": [...], "networks": [...]}, ...}}"""
        if not isinstance(data, dict) or not isinstance(data.get("regions"), dict):
            raise RegionMapError("region map must be an object with a 'regions' object")
        host_rules: list[tuple[PatternList, str]] = []
        networks: list[tuple[Network, str]] = []
        for region, spec in data["regions"].items():
            if not isinstance(spec, dict):
                raise RegionMapError(f"region {region!r} must be an object with 'hosts' and/or 'networks'")
            hosts = spec.get("hosts", [])
            try:
                host_rules.append((PatternList.compile(hosts, "host"), str(region)))
            except (PatternError, TypeError) as exc:
                raise RegionMapError(f"region {region!r}: {exc}") from exc
            for net in spec.get("networks", []):
                try:
                    networks.append((ipaddress.ip_network(net, strict=False), str(region)))
                except (ValueError, TypeError) as exc:
                    raise RegionMapError(f"region {region!r}: {net!r} is not a network: {exc}") from exc
        # Most specific network first so a /24 inside a /8 wins.
        networks.sort(key=lambda item: -item[0].prefixlen)
        digest = hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()
        return cls(tuple(host_rules), tuple(networks), digest)

    def regions_for(self, host: str, address: IPAddress | None) -> set[str]:
        """Every region a normalised host name and its address are known to be in (empty: unknown)."""
        found: set[str] = set()
        for patterns, region in self.host_rules:
            if patterns.match(host):
                found.add(region)
                break
        if address is not None:
            for network, region in self.networks:
                if address.version == network.version and address in network:
                    found.add(region)
                    break
        return found
