"""The egress filter's settings as plain values, and the functions that validate them.

The settings model (enforcer/egress_settings.py, pydantic) declares them and validates each field
with the functions here; a launch reads them from its environment with the same functions
(`validated`) without importing pydantic, whose import would be most of what a launch with allowed
hosts spends on its settings (bench/RESULTS.md). Both give the filter an `EgressValues`.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path

RESOLV_CONF = Path("/etc/resolv.conf")
DOCUMENTATION = tuple(
    ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")
)


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
    port_text: str | None
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError("expected [IPv6] or [IPv6]:PORT")
        port_text = rest[1:] if rest else None
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, None
    ip = ipaddress.ip_address(host)  # ValueError for names: the resolver must be an address
    port = 53 if port_text is None else int(port_text)  # ValueError for an empty port too
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


# ---- one validator per kind of field: each takes what the environment (a string) or the daemon's TOML
# file (a string, a number, a list) gives, and raises ValueError with the message both loaders report.


def check_endpoint(value: object) -> str | None:
    """upstream_dns: an address with an optional port; empty is unset."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    try:
        parse_endpoint(value)
    except ValueError as exc:
        raise ValueError(f"upstream_dns must be IP:PORT or [IPv6]:PORT, not {value!r} ({exc})") from None
    return value


def check_test_ranges(value: object) -> tuple[str, ...]:
    """public_test_ranges: comma-separated (or a list), each inside a documentation range."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list | tuple):
        raise ValueError("Input should be a valid list")
    items = []
    for item in value:
        if not isinstance(item, str):
            raise ValueError(f"Input should be a valid string, not {item!r}")
        network = ipaddress.ip_network(item, strict=False)
        if not any(_inside(network, doc) for doc in DOCUMENTATION):
            raise ValueError(
                f"{item} is not inside a documentation range "
                f"({', '.join(map(str, DOCUMENTATION))}); only those can be made public for tests"
            )
        items.append(item)
    return tuple(items)


def check_region(value: object) -> str | None:
    """home_region: a name of the region map (checked against it where the map is loaded)."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError("Input should be a valid string")
    return value


def _number(value: object) -> float:
    if isinstance(value, bool):  # a TOML boolean is no duration
        raise ValueError("Input should be a valid number")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            raise ValueError("Input should be a valid number, unable to parse string as a number") from None
    raise ValueError("Input should be a valid number")


def _integer(value: object) -> int:
    if isinstance(value, bool):
        raise ValueError("Input should be a valid integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError("Input should be a valid integer, got a number with a fractional part")
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            raise ValueError("Input should be a valid integer, unable to parse string as an integer") from None
    raise ValueError("Input should be a valid integer")


def _bounded(value: float, low: float, high: float, low_open: bool) -> None:
    if value != value:  # NaN passes no bound
        raise ValueError("Input should be a finite number")
    if low_open and not value > low:
        raise ValueError(f"Input should be greater than {low:g}")
    if not low_open and not value >= low:
        raise ValueError(f"Input should be greater than or equal to {low:g}")
    if not value <= high:
        raise ValueError(f"Input should be less than or equal to {high:g}")


def seconds(low_open: float, high: float) -> Callable[[object], float]:
    """A duration in seconds in (low_open, high]."""

    def check(value: object) -> float:
        number = _number(value)
        _bounded(number, low_open, high, low_open=True)
        return number

    return check


def count(low: int, high: int) -> Callable[[object], int]:
    """An integer in [low, high]."""

    def check(value: object) -> int:
        number = _integer(value)
        _bounded(number, low, high, low_open=False)
        return number

    return check


@dataclass(frozen=True)
class EgressValues:
    """What a session's egress filter is given: the values of the settings of the same names."""

    upstream_dns: str | None = None  # None: the first nameserver in /etc/resolv.conf
    public_test_ranges: tuple[str, ...] = ()
    home_region: str | None = None
    dns_timeout_s: float = 2.0
    connect_timeout_s: float = 5.0
    max_connections: int = 1024
    sniff_timeout_ms: int = 250
    message_timeout_ms: int = 5000

    def __post_init__(self) -> None:
        """Values built in code are held to the same checks as the ones read from settings."""
        for name, check in CHECKS.items():
            object.__setattr__(self, name, check(getattr(self, name)))

    def resolver(self) -> tuple[str, int] | None:
        configured = self.upstream_dns or system_resolver()
        return parse_endpoint(configured) if configured else None


# Each field's validator; the settings model validates its fields of the same names with them.
CHECKS: dict[str, Callable[[object], object]] = {
    "upstream_dns": check_endpoint,
    "public_test_ranges": check_test_ranges,
    "home_region": check_region,
    "dns_timeout_s": seconds(0, 30),
    "connect_timeout_s": seconds(0, 120),
    "max_connections": count(1, 65536),
    "sniff_timeout_ms": count(10, 5000),
    "message_timeout_ms": count(100, 60000),
}
NAMES = tuple(f.name for f in fields(EgressValues))


class EgressValueError(ValueError):
    """Refused values: `problems` holds (setting, message) for each, in field order."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{name}: {message}" for name, message in problems))
        self.problems = problems


def validated(given: Mapping[str, object]) -> EgressValues:
    """The values from settings by name (others ignored; unset: the default); EgressValueError names
    every value refused."""
    values: dict[str, object] = {}
    problems: list[tuple[str, str]] = []
    for name in NAMES:
        if name not in given:
            continue
        try:
            values[name] = CHECKS[name](given[name])
        except ValueError as exc:
            problems.append((name, str(exc)))
    if problems:
        raise EgressValueError(problems)
    return EgressValues(**values)  # type: ignore[arg-type]  # each checked above
