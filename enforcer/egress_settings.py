"""The egress filter's settings, validated (pydantic). They are read from the environment or
adl-enforcerd's TOML file as part of the one settings model, enforcer/settings.py, which extends
this one; a session's filter is given them as this model (`EnforcerSettings.egress()`)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

RESOLV_CONF = Path("/etc/resolv.conf")


def system_resolver(resolv_conf: Path = RESOLV_CONF) -> str | None:
    """The first nameserver of resolv.conf as IP:PORT (None when it names none)."""
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            address = fields[1].split("%")[0]
            return f"[{address}]:53" if ":" in address else f"{address}:53"
    return None


def parse_endpoint(value: str) -> tuple[str, int]:
    """'IP:PORT' or '[IPv6]:PORT' (port optional, 53 by default) -> (ip, port)."""
    text = value.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    ip = ipaddress.ip_address(host)  # ValueError for names: the resolver must be an address
    port = int(port_text) if port_text else 53
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    return str(ip), port


def _inside(
    network: ipaddress.IPv4Network | ipaddress.IPv6Network, outer: ipaddress.IPv4Network | ipaddress.IPv6Network
) -> bool:
    """subnet_of across versions: an address of the other version is never inside."""
    if isinstance(network, ipaddress.IPv4Network) and isinstance(outer, ipaddress.IPv4Network):
        return network.subnet_of(outer)
    if isinstance(network, ipaddress.IPv6Network) and isinstance(outer, ipaddress.IPv6Network):
        return network.subnet_of(outer)
    return False


class EgressSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    upstream_dns: str | None = Field(
        default=None,
        description="resolver the egress filter asks (IP:PORT or [IPv6]:PORT); default: the first "
        "nameserver in /etc/resolv.conf",
    )
    public_test_ranges: list[str] = Field(
        default_factory=list,
        description="documentation ranges (198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) to treat as public "
        "addresses, for test networks only; comma-separated; every session that uses it says so in its audit",
    )
    home_region: str | None = Field(
        default=None,
        description="the operator's region (a name from the region map): where ADL cross_border_restricted "
        "data must stay",
    )
    dns_timeout_s: float = Field(default=2.0, gt=0, le=30, description="upstream DNS timeout")
    connect_timeout_s: float = Field(default=5.0, gt=0, le=120, description="dial timeout for allowed connections")
    max_connections: int = Field(
        default=1024, ge=1, le=65536, description="open connections per session; more are refused (and audited)"
    )
    sniff_timeout_ms: int = Field(
        default=250,
        ge=10,
        le=5000,
        description="how long to wait for a client's first byte before taking it for a server-speaks-first "
        "protocol (opaque TCP: decided as 'tcp')",
    )
    message_timeout_ms: int = Field(
        default=5000,
        ge=100,
        le=60000,
        description="how long a client may take to finish a TLS ClientHello or an HTTP request head (chunk-size "
        "line) once it started one; slower ones are refused",
    )

    @field_validator("upstream_dns")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        try:
            parse_endpoint(value)
        except ValueError as exc:
            raise ValueError(f"upstream_dns must be IP:PORT or [IPv6]:PORT, not {value!r} ({exc})") from None
        return value

    @field_validator("public_test_ranges", mode="before")
    @classmethod
    def _ranges(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            for item in value:
                network = ipaddress.ip_network(str(item), strict=False)
                if not any(_inside(network, doc) for doc in _DOCUMENTATION):
                    raise ValueError(
                        f"{item} is not inside a documentation range "
                        f"({', '.join(map(str, _DOCUMENTATION))}); only those can be made public for tests"
                    )
        return value

    def resolver(self) -> tuple[str, int] | None:
        configured = self.upstream_dns or system_resolver()
        return parse_endpoint(configured) if configured else None

    def egress_config(self) -> dict[str, object]:
        """What a session's egress filter needs, as plain data (crosses the daemon's spawner pipe)."""
        return self.model_dump(include=set(EgressSettings.model_fields))


_DOCUMENTATION = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)
