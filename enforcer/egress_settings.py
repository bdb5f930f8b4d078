"""The egress filter's settings model (pydantic). They are read from the environment or
adl-enforcerd's TOML file as part of the one settings model, enforcer/settings/model.py, which extends
this one. Each field is validated by the function enforcer/egress_values.py holds for it, which a
launch uses without pydantic; a session's filter is given the values (`EgressValues`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from .egress_values import CHECKS, NAMES, RESOLV_CONF, EgressValues, parse_endpoint, system_resolver

__all__ = ["RESOLV_CONF", "EgressSettings", "EgressValues", "parse_endpoint", "system_resolver"]
_DEFAULT = EgressValues()


class EgressSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)

    upstream_dns: str | None = Field(
        default=_DEFAULT.upstream_dns,
        description="resolver the egress filter asks (IP:PORT or [IPv6]:PORT); default: the first "
        "nameserver in /etc/resolv.conf",
    )
    public_test_ranges: list[str] = Field(
        default_factory=list,
        description="documentation ranges (198.51.100.0/24, 203.0.113.0/24, 2001:db8::/32) to treat as public "
        "addresses, for test networks only; comma-separated; every session that uses it says so in its audit",
    )
    home_region: str | None = Field(
        default=_DEFAULT.home_region,
        description="the operator's region (a name from the region map): where ADL cross_border_restricted "
        "data must stay",
    )
    dns_timeout_s: float = Field(default=_DEFAULT.dns_timeout_s, description="upstream DNS timeout")
    connect_timeout_s: float = Field(
        default=_DEFAULT.connect_timeout_s, description="dial timeout for allowed connections"
    )
    max_connections: int = Field(
        default=_DEFAULT.max_connections, description="open connections per session; more are refused (and audited)"
    )
    sniff_timeout_ms: int = Field(
        default=_DEFAULT.sniff_timeout_ms,
        description="how long to wait for a client's first byte before taking it for a server-speaks-first "
        "protocol (opaque TCP: decided as 'tcp')",
    )
    message_timeout_ms: int = Field(
        default=_DEFAULT.message_timeout_ms,
        description="how long a client may take to finish a TLS ClientHello or an HTTP request head (chunk-size "
        "line) once it started one; slower ones are refused",
    )

    @field_validator(*NAMES, mode="before")
    @classmethod
    def _check(cls, value: object, info: ValidationInfo) -> object:
        """The launch's own validator for the field, with its message as it is (no 'Value error, ')."""
        name = info.field_name
        assert name is not None
        try:
            checked = CHECKS[name](value)
        except ValueError as exc:
            raise PydanticCustomError("egress_setting", str(exc)) from None
        return list(checked) if isinstance(checked, tuple) else checked

    def values(self) -> EgressValues:
        """What a session's filter is given."""
        return EgressValues(**{name: getattr(self, name) for name in NAMES})
