"""Typed actions, decisions and the compiled policy. Frozen: a Policy never changes once built."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from ..quick_dataclass import dataclass
from .errors import Finding
from .patterns import PatternList
from .regions import RegionMap

if TYPE_CHECKING:
    from .conditions import CompiledCondition

Verdict = Literal["ALLOW", "DENY", "ASK"]
DEFAULT_APPROVAL_TIMEOUT_S = 300  # when neither the tool nor the AAIF document names one; expiry denies
Access = Literal["read", "write", "read_write"]


# ---- actions ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: Any = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NetworkConnect:
    host: str  # the name the agent meant, or the literal address when it used none
    port: int
    protocol: str = "tcp"  # tcp | http | https | tls | dns | udp | quic
    address: str | None = None  # the address the enforcer would dial


@dataclass(frozen=True, slots=True)
class FileAccess:
    path: str
    mode: Access = "read"


@dataclass(frozen=True, slots=True)
class ProcessExec:
    argv: tuple[str, ...]
    resolved_path: str | None = None


@dataclass(frozen=True, slots=True)
class EnvVar:
    name: str


Action = ToolCall | NetworkConnect | FileAccess | ProcessExec | EnvVar


# ---- decisions -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reason:
    rule: str  # stable id, e.g. "net.host_not_allowed"
    pointer: str  # JSON Pointer into the source document ("/permissions/network/allowed_hosts/0")
    text: str
    document: Literal["adl", "aaif", "enforcer"] = "adl"

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "pointer": self.pointer, "document": self.document, "text": self.text}


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    reasons: tuple[Reason, ...]
    obligations: Mapping[str, Any]
    policy_digest: str

    @property
    def allowed(self) -> bool:
        return self.verdict == "ALLOW"

    def to_json(self) -> dict[str, Any]:
        return {
            "decision": self.verdict,
            "reasons": [r.to_json() for r in self.reasons],
            "obligations": dict(self.obligations),
            "policy_digest": self.policy_digest,
        }


# ---- compiled policy -------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolRule:
    name: str
    pointer: str
    description: str
    requires_confirmation: bool
    read_only: bool
    sensitivity: str | None
    validators: tuple[tuple[str, Any], ...]  # (pointer of the schema, jsonschema_rs validator)
    auth_env_var: str | None = None

    @cached_property
    def allowed(self) -> Reason:
        """The reason of every ALLOW of this tool, built once: it is the same for each call."""
        return Reason("tool.allowed", self.pointer, f"tool '{self.name}' is declared and its arguments are valid")


@dataclass(frozen=True)
class NetworkRules:
    hosts: PatternList
    ports: frozenset[int] | None  # None: absent (ports come from protocols)
    protocols: frozenset[str] | None  # None: any protocol
    deny_private: bool
    deny_private_explicit: bool


@dataclass(frozen=True)
class FilesystemRules:
    allowed: PatternList
    access: tuple[Access, ...]  # per allowed pattern
    denied: PatternList


@dataclass(frozen=True)
class NameRules:
    allowed: PatternList
    denied: PatternList


@dataclass(frozen=True)
class ExecutionRules:
    allowed: PatternList
    denied: PatternList
    allow_shell: bool


@dataclass(frozen=True)
class ResourceLimits:
    max_memory_mb: float | None = None
    max_cpu_percent: float | None = None
    max_duration_sec: float | None = None
    max_concurrent: int | None = None


@dataclass(frozen=True)
class ApprovalGate:
    """When a human must approve a tool call (ASK)."""

    mode: Literal["all", "writes", "condition"]
    condition: CompiledCondition | None
    timeout_seconds: int
    pointer: str
    source: str  # human text for explain


@dataclass(frozen=True)
class Lifecycle:
    status: str | None
    verdict: Literal["ok", "warn", "refuse"]
    reason: str


@dataclass(frozen=True)
class Residency:
    region: str  # EU, US, UK, APAC, custom, or an operator region name
    pointer: str
    document: Literal["adl", "aaif"]


@dataclass(frozen=True)
class CompileOptions:
    production: bool = False
    require_signature: bool = True  # for confidential/restricted documents
    home_region: str | None = None
    regions: RegionMap = field(default_factory=RegionMap.empty)
    public_test_ranges: tuple[str, ...] = ()
    host_addresses: tuple[str, ...] = ()
    # AAIF capabilities the agent's own runtime provides, as the operator states them.
    runtime_capabilities: tuple[str, ...] = ()

    def digest_input(self) -> dict[str, Any]:
        extra = {"runtime_capabilities": sorted(self.runtime_capabilities)} if self.runtime_capabilities else {}
        return {
            **extra,
            "production": self.production,
            "require_signature": self.require_signature,
            "home_region": self.home_region,
            "regions": self.regions.digest,
            "public_test_ranges": list(self.public_test_ranges),
            "host_addresses": list(self.host_addresses),
        }


@dataclass(frozen=True)
class Policy:
    agent_name: str
    agent_id: str | None
    agent_version: str | None
    adl_spec: str
    digest: str
    sensitivity: str
    signature: str  # absent | verified | invalid
    lifecycle: Lifecycle
    tools: Mapping[str, ToolRule]
    aaif_only_tools: frozenset[str]
    network: NetworkRules | None
    filesystem: FilesystemRules | None
    environment: NameRules | None
    execution: ExecutionRules | None
    limits: ResourceLimits | None
    approval: ApprovalGate | None
    residency: tuple[Residency, ...]
    pii_mode: str
    audit_required: bool
    safety_level: str
    tool_timeout_ms: int | None
    secret_env: frozenset[str]
    warnings: tuple[Finding, ...]
    options: CompileOptions
    # The decision of every plain ALLOW of a tool (no PII found, no approval needed), built once:
    # each such call gets the same object, so that what callers derive from it can be kept too.
    # Derived from the members above, so left out of comparisons and repr.
    tool_allowed: Mapping[str, Decision] = field(repr=False, compare=False)
    public_test_networks: tuple[Any, ...] = ()
    host_ips: tuple[Any, ...] = ()
