"""Compile a validated ADL document (+ optional AAIF document) into an immutable Policy."""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import replace
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any

import rfc8785

from .aaif import (
    PROVIDED_CAPABILITIES,
    capability_findings,
    compliance_of,
    condition_findings,
    safety_level_of,
    validate_aaif,
)
from .adl import SENSITIVITY_ORDER, validate_adl
from .argschema import ArgumentSchema, build_validator
from .conditions import UnsupportedCondition, compile_condition
from .credentials import find_inline_credentials
from .errors import DocumentRejected, Finding, pointer
from .formats import parse_timestamp
from .jsonvalues import obj
from .model import (
    DEFAULT_APPROVAL_TIMEOUT_S,
    ApprovalGate,
    CompileOptions,
    Decision,
    ExecutionRules,
    FilesystemRules,
    Lifecycle,
    NameRules,
    NetworkRules,
    Policy,
    Residency,
    ResourceLimits,
    ToolRule,
)
from .patterns import PatternList
from .specs import SchemaSet

SUNSET_WARNING = timedelta(days=30)


def policy_digest(adl: dict[str, Any], aaif: dict[str, Any] | None, options: CompileOptions) -> str:
    value = {"adl": adl, "aaif": aaif, "options": options.digest_input()}
    try:
        canonical = rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        # Integers beyond I-JSON have no JCS form; the digest only has to be exact and
        # deterministic, so those documents hash a sorted compact serialisation, in its own domain.
        exact = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        canonical = b"adl-enforcer exact JSON\0" + exact.encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()


def time_boundaries(adl: dict[str, Any]) -> tuple[datetime, ...]:
    """The instants at which compiling the same documents may give another result: `now` decides
    only against the sunset date and the attestation's expiry (each also 30 days ahead, for the
    warnings). A compiled policy stays exact while no boundary lies between its `now` and the next."""
    from .adl import NEAR_EXPIRY

    found = []
    for value in (
        obj(adl.get("lifecycle")).get("sunset_date"),
        obj(obj(adl.get("security")).get("attestation")).get("expires_at"),
    ):
        instant = parse_timestamp(value)
        if instant is not None:
            found += [instant, instant - NEAR_EXPIRY, instant - SUNSET_WARNING]
    return tuple(sorted(set(found)))


def compile_policy(
    adl: dict[str, Any],
    aaif: dict[str, Any] | None,
    schemas: SchemaSet,
    now: datetime,
    options: CompileOptions | None = None,
) -> Policy:
    """Validate both documents and compile them; raise DocumentRejected listing every error."""
    options = options or CompileOptions()
    findings, signature = validate_adl(adl, schemas, now)
    findings.extend(find_inline_credentials(adl))
    compliance: dict[str, Any] = {}
    safety_level = "standard"
    if aaif is not None:
        findings.extend(validate_aaif(aaif, schemas))
        findings.extend(condition_findings(aaif))
        findings.extend(capability_findings(aaif, PROVIDED_CAPABILITIES | set(options.runtime_capabilities)))
        compliance, safety_level = compliance_of(aaif), safety_level_of(aaif)
        agent = obj(aaif.get("agent"))
        if isinstance(agent.get("name"), str) and agent.get("name") != adl.get("name"):
            findings.append(
                Finding(
                    "ENF-2005",
                    f"AAIF agent.name {agent.get('name')!r} differs from ADL name "
                    f"{adl.get('name')!r}; both documents must describe the same agent",
                    "/agent/name",
                )
            )
    classification = obj(adl.get("data_classification"))
    sensitivity = str(classification.get("sensitivity", "restricted"))
    if options.require_signature and SENSITIVITY_ORDER.get(sensitivity, 3) >= 2 and signature.state != "verified":
        findings.append(
            Finding(
                "ENF-2006",
                f"a '{sensitivity}' document must carry a verified attestation "
                "signature (the operator can waive this requirement)",
                "/security/attestation",
            )
        )
    try:
        digest = policy_digest(adl, aaif, options)
    except rfc8785.CanonicalizationError as exc:
        findings.append(Finding("ADL-1001", f"document cannot be canonicalised (RFC 8785): {exc}"))
    if any(f.severity == "error" for f in findings):
        raise DocumentRejected(findings)
    builder = _Builder(adl, aaif, compliance, options, now)
    policy = builder.build(sensitivity, signature.state, safety_level, digest)
    warnings = tuple(f for f in findings if f.severity == "warning") + tuple(builder.warnings)
    return replace(policy, warnings=warnings)


class _Builder:
    def __init__(
        self,
        adl: dict[str, Any],
        aaif: dict[str, Any] | None,
        compliance: dict[str, Any],
        options: CompileOptions,
        now: datetime,
    ) -> None:
        self.adl = adl
        self.aaif = aaif
        self.compliance = compliance
        self.options = options
        self.now = now
        self.permissions = obj(adl.get("permissions"))
        self.warnings: list[Finding] = []

    def warn(self, code: str, detail: str, ptr: str) -> None:
        self.warnings.append(Finding(code, detail, ptr, "warning"))

    def build(self, sensitivity: str, signature: str, safety_level: str, digest: str) -> Policy:
        tools, aaif_only = self.tools()
        handling = obj(obj(self.adl.get("data_classification")).get("handling"))
        invocation = obj(obj(self.adl.get("runtime")).get("tool_invocation"))
        timeout = invocation.get("timeout_ms")
        timeout = timeout if isinstance(timeout, int) and timeout > 0 else None
        obligations = MappingProxyType({"timeout_ms": timeout} if timeout else {})
        return Policy(
            agent_name=str(self.adl.get("name", "")),
            agent_id=self.adl.get("id") if isinstance(self.adl.get("id"), str) else None,
            agent_version=self.adl.get("version") if isinstance(self.adl.get("version"), str) else None,
            adl_spec=str(self.adl.get("adl_spec")),
            digest=digest,
            sensitivity=sensitivity,
            signature=signature,
            lifecycle=self.lifecycle(),
            tools=MappingProxyType(tools),
            aaif_only_tools=frozenset(aaif_only),
            network=self.network(),
            filesystem=self.filesystem(),
            environment=self.names("environment", "allowed_variables", "denied_variables"),
            execution=self.execution(),
            limits=self.limits(),
            approval=self.approval(safety_level),
            residency=self.residency(),
            pii_mode=self.pii_mode(),
            audit_required=bool(self.compliance.get("audit_log")) or bool(handling.get("logging_required")),
            safety_level=safety_level,
            tool_timeout_ms=timeout,
            secret_env=frozenset(t.auth_env_var for t in tools.values() if t.auth_env_var),
            warnings=(),
            options=self.options,
            public_test_networks=tuple(ipaddress.ip_network(n, strict=False) for n in self.options.public_test_ranges),
            host_ips=tuple(ipaddress.ip_address(a) for a in self.options.host_addresses),
            tool_allowed=MappingProxyType(
                {name: Decision("ALLOW", (rule.allowed,), obligations, digest) for name, rule in tools.items()}
            ),
        )

    def lifecycle(self) -> Lifecycle:
        lifecycle = obj(self.adl.get("lifecycle"))
        status = lifecycle.get("status") if isinstance(lifecycle.get("status"), str) else None
        sunset = parse_timestamp(lifecycle.get("sunset_date"))
        if status == "retired":
            return Lifecycle(status, "refuse", "lifecycle.status is 'retired': retired agents never run")
        if status == "deprecated" and sunset is not None and sunset <= self.now:
            return Lifecycle(
                status, "refuse", f"deprecated and past its sunset_date {lifecycle['sunset_date']}: treated as retired"
            )
        if status == "draft" and self.options.production:
            return Lifecycle(status, "refuse", "lifecycle.status is 'draft' and the enforcer runs in production mode")
        notes = []
        if status == "deprecated":
            successor = lifecycle.get("successor")
            notes.append("deprecated" + (f"; migrate to {successor}" if successor else ""))
        if status == "draft":
            notes.append("draft: not for production use")
        if notes:
            self.warn("ENF-2007", "; ".join(notes), "/lifecycle")
        # validate_adl warns about a near sunset itself; the lifecycle verdict still names it.
        if sunset is not None and self.now < sunset <= self.now + SUNSET_WARNING:
            notes.append(f"sunset_date {lifecycle['sunset_date']} is within 30 days")
        if notes:
            return Lifecycle(status, "warn", "; ".join(notes))
        return Lifecycle(status, "ok", "no lifecycle restriction" if status is None else f"status '{status}'")

    def tools(self) -> tuple[dict[str, ToolRule], set[str]]:
        aaif_tools: dict[str, tuple[int, dict[str, Any]]] = {}
        if self.aaif is not None:
            for i, tool in enumerate(obj(self.aaif.get("agent")).get("tools") or []):
                if isinstance(tool, dict) and isinstance(tool.get("name"), str):
                    aaif_tools[tool["name"]] = (i, tool)
        rules: dict[str, ToolRule] = {}
        for i, tool in enumerate(self.adl.get("tools") or []):
            name = tool["name"]
            validators: list[tuple[str, Any]] = []
            if isinstance(tool.get("parameters"), dict | bool):
                schema = tool["parameters"]
                validators.append((pointer("tools", i, "parameters"), ArgumentSchema(schema, build_validator(schema))))
            auth_env = None
            if name in aaif_tools:
                j, atool = aaif_tools[name]
                if isinstance(atool.get("parameters_schema"), dict):
                    validators.append(
                        (
                            pointer("agent", "tools", j, "parameters_schema"),
                            ArgumentSchema(atool["parameters_schema"], build_validator(atool["parameters_schema"])),
                        )
                    )
                env_var = obj(atool.get("auth")).get("env_var")
                auth_env = env_var if isinstance(env_var, str) else None
            rules[name] = ToolRule(
                name=name,
                pointer=pointer("tools", i),
                description=str(tool.get("description", "")),
                requires_confirmation=tool.get("requires_confirmation") is True,
                read_only=tool.get("read_only") is True,
                sensitivity=obj(tool.get("data_classification")).get("sensitivity"),
                validators=tuple(validators),
                auth_env_var=auth_env,
            )
        aaif_only = set(aaif_tools) - set(rules)
        for name in sorted(aaif_only):
            self.warn(
                "ENF-2004",
                f"tool '{name}' is declared in AAIF but not in ADL; calls to it are denied",
                pointer("agent", "tools", aaif_tools[name][0]),
            )
        return rules, aaif_only

    def network(self) -> NetworkRules | None:
        network = self.permissions.get("network")
        if not isinstance(network, dict):
            return None
        hosts = network.get("allowed_hosts") or []
        ports = network.get("allowed_ports")
        protocols = network.get("allowed_protocols")
        if ports is None and not protocols:
            self.warn(
                "ENF-2004",
                "network has neither allowed_ports nor allowed_protocols: no port is granted, "
                "so no connection can be made",
                "/permissions/network",
            )
        deny_private = network.get("deny_private")
        return NetworkRules(
            hosts=PatternList.compile(hosts, "host"),
            ports=frozenset(ports) if isinstance(ports, list) else None,
            protocols=frozenset(str(p).lower() for p in protocols) if isinstance(protocols, list) else None,
            deny_private=deny_private is not False,
            deny_private_explicit=isinstance(deny_private, bool),
        )

    def filesystem(self) -> FilesystemRules | None:
        fs = self.permissions.get("filesystem")
        if not isinstance(fs, dict):
            return None
        entries = fs.get("allowed_paths") or []
        return FilesystemRules(
            allowed=PatternList.compile([e["path"] for e in entries], "path"),
            access=tuple(e["access"] for e in entries),
            denied=PatternList.compile(fs.get("denied_paths") or [], "path"),
        )

    def names(self, domain: str, allow_key: str, deny_key: str) -> NameRules | None:
        section = self.permissions.get(domain)
        if not isinstance(section, dict):
            return None
        allowed = section.get(allow_key) or []
        return NameRules(PatternList.compile(allowed, "env"), PatternList.compile(section.get(deny_key) or [], "env"))

    def execution(self) -> ExecutionRules | None:
        section = self.permissions.get("execution")
        if not isinstance(section, dict):
            return None
        return ExecutionRules(
            allowed=PatternList.compile(section.get("allowed_commands") or [], "command"),
            denied=PatternList.compile(section.get("denied_commands") or [], "command"),
            allow_shell=section.get("allow_shell") is True,
        )

    def limits(self) -> ResourceLimits | None:
        section = self.permissions.get("resource_limits")
        if not isinstance(section, dict):
            return None
        return ResourceLimits(
            max_memory_mb=section.get("max_memory_mb"),
            max_cpu_percent=section.get("max_cpu_percent"),
            max_duration_sec=section.get("max_duration_sec"),
            max_concurrent=section.get("max_concurrent"),
        )

    def approval(self, safety_level: str) -> ApprovalGate | None:
        hitl = obj(self.compliance.get("human_in_the_loop"))
        if hitl.get("enabled") is not True:
            return None
        ptr = "/agent/compliance/human_in_the_loop"
        timeout = hitl.get("timeout_seconds")
        timeout = timeout if isinstance(timeout, int) and timeout > 0 else DEFAULT_APPROVAL_TIMEOUT_S
        trigger = hitl.get("trigger")
        if trigger is None:
            return ApprovalGate("all", None, timeout, ptr, "every tool call (no trigger given)")
        if isinstance(trigger, str):
            return ApprovalGate(
                "writes", None, timeout, ptr + "/trigger", f"hint {trigger!r}: every tool call not declared read_only"
            )
        try:
            condition = compile_condition(trigger)
        except UnsupportedCondition as exc:
            # strict/regulated were rejected by condition_findings; never let a trigger we cannot
            # evaluate open the gate.
            if safety_level == "minimal":
                return ApprovalGate(
                    "writes",
                    None,
                    timeout,
                    ptr + "/trigger",
                    f"unsupported trigger ({exc}): every tool call not declared read_only",
                )
            return ApprovalGate("all", None, timeout, ptr + "/trigger", f"unsupported trigger ({exc}): every tool call")
        return ApprovalGate("condition", condition, timeout, ptr + "/trigger", f"{trigger.get('lang')} condition")

    def residency(self) -> tuple[Residency, ...]:
        out: list[Residency] = []
        region = self.compliance.get("data_residency")
        if isinstance(region, str) and region != "global":
            out.append(Residency(region, "/agent/compliance/data_residency", "aaif"))
        handling = obj(obj(self.adl.get("data_classification")).get("handling"))
        if handling.get("cross_border_restricted") is True:
            home = self.options.home_region
            if home is None:
                self.warn(
                    "ENF-2004",
                    "cross_border_restricted is set but no home region is configured: every connection is denied",
                    "/data_classification/handling/cross_border_restricted",
                )
                home = "(unconfigured home region)"
            out.append(Residency(home, "/data_classification/handling/cross_border_restricted", "adl"))
        if len({r.region for r in out}) > 1:
            self.warn(
                "ENF-2004",
                f"residency constraints disagree ({', '.join(r.region for r in out)}): no connection can satisfy both",
                out[0].pointer,
            )
        return tuple(out)

    def pii_mode(self) -> str:
        mode = self.compliance.get("pii_handling")
        if isinstance(mode, str):
            return mode
        handling = obj(obj(self.adl.get("data_classification")).get("handling"))
        if handling.get("anonymization_required") is True:
            return "anonymize"
        categories = obj(self.adl.get("data_classification")).get("categories") or []
        return "detect" if "pii" in categories or self.aaif is not None else "none"
