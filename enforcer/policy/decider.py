"""decide(policy, action) -> Decision: pure, deterministic, never raises. Default DENY.

Every branch names a stable rule id and a JSON Pointer into the document that decided it.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import socket
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from .addresses import classify
from .errors import pointer
from .jsonvalues import Path
from .model import (
    DEFAULT_APPROVAL_TIMEOUT_S,
    Action,
    Decision,
    EnvVar,
    FileAccess,
    NetworkConnect,
    NetworkRules,
    Policy,
    ProcessExec,
    Reason,
    ToolCall,
)
from .patterns import PatternError, normalize_host
from .pii import Spans, findings, scan_leaves

SHELLS = frozenset(
    {"sh", "bash", "dash", "zsh", "ksh", "mksh", "csh", "tcsh", "fish", "ash", "busybox", "rbash", "yash", "posh"}
)
DEFAULT_PORTS = {
    "http": (80,),
    "https": (443,),
    "ws": (80,),
    "wss": (443,),
    "ssh": (22,),
    "dns": (53,),
    "smtp": (25, 587),
    "smtps": (465,),
    "imaps": (993,),
    "ftp": (21,),
    "postgres": (5432,),
    "mysql": (3306,),
    "redis": (6379,),
    "grpc": (443,),
    "tls": (443,),
}
# A declared `tcp` grants any stream over TCP, so the protocols carried on one too. No other
# declared protocol stands in for a different one: the caller names what it will speak, and
# traffic the egress filter cannot tell apart on the wire is its business to resolve or refuse.
_TCP_CARRIED = frozenset({"http", "https", "tls", "ws", "wss", "grpc", "tcp"})
# A normalised host name: LDH labels (and '_', which service names use); anything else is no name.
_HOST_NAME = re.compile(r"\A[a-z0-9_-]+(?:\.[a-z0-9_-]+)*\Z")
_MAYBE_LITERAL = re.compile(r"\A\[?[0-9a-fA-FxX.:]+(?:%[^\]]*)?\]?\Z")
# The numeric host forms the C resolver (inet_aton) reads as IPv4: 127.1, 0x7f.1, 2130706433.
_INET_ATON_FORM = re.compile(r"\A(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+)){0,3}\Z")
_EMPTY: Mapping[str, Any] = MappingProxyType({})
_LOOPBACK = ipaddress.IPv4Address("127.0.0.1")


def _deny(policy: Policy, rule: str, ptr: str, text: str, document: str = "adl") -> Decision:
    return Decision("DENY", (Reason(rule, ptr, text, document),), _EMPTY, policy.digest)  # type: ignore[arg-type]


def decide(policy: Policy, action: Action, *, pii: Mapping[Path, Spans] | None = None) -> Decision:
    """`pii`: scan_leaves() of a tool call's arguments, when the caller has scanned them already."""
    try:
        if policy.lifecycle.verdict == "refuse":
            return _deny(policy, "lifecycle.refused", "/lifecycle/status", policy.lifecycle.reason)
        if isinstance(action, ToolCall):
            return _tool(policy, action, pii)
        if isinstance(action, NetworkConnect):
            return _network(policy, action)
        if isinstance(action, FileAccess):
            return _file(policy, action)
        if isinstance(action, ProcessExec):
            return _exec(policy, action)
        if isinstance(action, EnvVar):
            return _env(policy, action)
        return _deny(policy, "action.unknown", "", f"unknown action type {type(action).__name__}", "enforcer")
    except Exception as exc:
        return _deny(policy, "enforcer.error", "", f"decision failed safely: {type(exc).__name__}: {exc}", "enforcer")


# ---- tool calls ------------------------------------------------------------------------------


def _tool(policy: Policy, call: ToolCall, pii: Mapping[Path, Spans] | None) -> Decision:
    rule = policy.tools.get(call.name) if isinstance(call.name, str) else None
    if rule is None:
        if call.name in policy.aaif_only_tools:
            return _deny(
                policy,
                "tool.undeclared",
                "/tools",
                f"tool '{call.name}' is declared in the AAIF document but not in the ADL document",
            )
        return _deny(policy, "tool.undeclared", "/tools", f"tool {call.name!r} is not declared")
    if not isinstance(call.arguments, dict):
        return _deny(policy, "tool.args_invalid", rule.pointer, "tool arguments must be a JSON object")
    for schema_ptr, validator in rule.validators:
        if not validator.is_valid(call.arguments):
            error = next(iter(validator.iter_errors(call.arguments)))
            where = pointer(*error.instance_path) or "/"
            document = "aaif" if schema_ptr.startswith("/agent/") else "adl"
            return _deny(
                policy,
                "tool.args_invalid",
                schema_ptr,
                f"arguments of '{call.name}' do not match its schema at {where}: {_schema_failure(error)}",
                document,
            )
    reasons: list[Reason] = []
    obligations: dict[str, Any] = {}
    if policy.pii_mode != "none":
        found = findings(scan_leaves(call.arguments) if pii is None else pii)
        if found:
            kinds = sorted({f.kind for f in found})
            pointers = sorted({f.pointer for f in found})
            if policy.pii_mode == "reject":
                return _deny(
                    policy,
                    "pii.reject",
                    "/agent/compliance/pii_handling",
                    f"arguments carry PII ({', '.join(kinds)}) at {', '.join(pointers)}",
                    "aaif",
                )
            obligations["pii"] = {"kinds": kinds, "pointers": pointers}
            if policy.pii_mode in ("anonymize", "encrypt"):
                obligations["mask"] = pointers
            reasons.append(
                Reason(
                    "pii.detected",
                    "/agent/compliance/pii_handling",
                    f"PII ({', '.join(kinds)}) at {', '.join(pointers)}: {policy.pii_mode}",
                    "aaif",
                )
            )
    ask = _approval(policy, call, rule.requires_confirmation, rule.read_only, rule.sensitivity, rule.pointer)
    if ask is None and not reasons:
        return policy.tool_allowed[call.name]
    if policy.tool_timeout_ms:
        obligations["timeout_ms"] = policy.tool_timeout_ms
    if ask is not None:
        obligations["approval_timeout_s"] = (
            policy.approval.timeout_seconds if policy.approval else DEFAULT_APPROVAL_TIMEOUT_S
        )
        return Decision("ASK", (ask, *reasons), MappingProxyType(obligations), policy.digest)
    return Decision("ALLOW", (rule.allowed, *reasons), MappingProxyType(obligations), policy.digest)


def _schema_failure(error: Any) -> str:
    """What failed, told from the schema's side. The validator's own message quotes the offending
    value, and reasons reach the audit log unmasked: a secret in a mistyped argument would too."""
    keyword = str(error.schema_path[-1]) if len(error.schema_path) else "schema"
    if keyword == "required":
        return str(error.message)  # names the missing member, which the schema itself declares
    return f"the value fails the schema's '{keyword}' rule"


def _approval(
    policy: Policy, call: ToolCall, confirm: bool, read_only: bool, sensitivity: str | None, tool_ptr: str
) -> Reason | None:
    if confirm:
        return Reason(
            "tool.requires_confirmation",
            tool_ptr + "/requires_confirmation",
            f"tool '{call.name}' requires human confirmation",
        )
    gate = policy.approval
    if gate is None:
        return None
    if gate.mode == "all" or (gate.mode == "writes" and not read_only):
        return Reason("hitl.trigger", gate.pointer, f"human approval required: {gate.source}", "aaif")
    if gate.mode == "condition" and gate.condition is not None:
        context = {
            "tool": {"name": call.name, "read_only": read_only, "sensitivity": sensitivity},
            "arguments": call.arguments,
            "input": call.arguments,
            "payload": call.arguments,
        }
        if gate.condition(context):
            return Reason("hitl.trigger", gate.pointer, f"human approval required: {gate.source} matched", "aaif")
    return None


# ---- network ---------------------------------------------------------------------------------


def _network(policy: Policy, conn: NetworkConnect) -> Decision:
    rules = policy.network
    if rules is None:
        return _deny(policy, "net.domain_absent", "/permissions", "no network permission is declared")
    try:
        host = normalize_host(conn.host)
    except (PatternError, AttributeError) as exc:
        return _deny(policy, "net.host_invalid", "/permissions/network/allowed_hosts", f"invalid host: {exc}")
    literal = ip_literal(host)
    if literal is None and not _HOST_NAME.match(host):
        # Not an address and not a name DNS could answer for ('a:443', 'x y', '*.a.com'): no
        # pattern may be read as granting it.
        return _deny(
            policy, "net.host_invalid", "/permissions/network/allowed_hosts", f"{host!r} is not a host name or address"
        )
    matched = rules.hosts.first(host)
    if matched is None:
        return _deny(
            policy,
            "net.host_not_allowed",
            "/permissions/network/allowed_hosts",
            f"host '{host}' matches no allowed_hosts pattern",
        )
    protocol = (conn.protocol or "tcp").lower()
    if protocol in ("udp", "quic"):
        return _deny(
            policy,
            "net.protocol_not_allowed",
            "/permissions/network",
            f"{protocol.upper()} is not relayed (only TCP and DNS)",
            "enforcer",
        )
    if rules.protocols is not None and not _protocol_allowed(protocol, rules.protocols):
        return _deny(
            policy,
            "net.protocol_not_allowed",
            "/permissions/network/allowed_protocols",
            f"protocol '{protocol}' is not in allowed_protocols ({', '.join(sorted(rules.protocols))})",
        )
    ports = granted_ports(rules)
    ports_ptr = "/permissions/network/allowed_" + ("ports" if rules.ports is not None else "protocols")
    if conn.port not in ports:
        granted = ", ".join(map(str, sorted(ports))) or "none"
        return _deny(policy, "net.port_not_allowed", ports_ptr, f"port {conn.port} is not allowed (allowed: {granted})")
    address = literal
    addresses = [literal] if literal is not None else []
    if literal is None and (host == "localhost" or host.endswith(".localhost")):
        addresses.append(_LOOPBACK)  # RFC 6761 §6.3: these names are loopback, whatever DNS says
    if conn.address is not None:
        try:
            address = ipaddress.ip_address(conn.address)
        except ValueError:
            return _deny(policy, "net.address_invalid", "", f"{conn.address!r} is not an IP address", "enforcer")
        addresses.append(address)
    # A literal host is its own address: it is classified even when the caller names no address,
    # and both are when the caller names one that differs.
    for candidate in dict.fromkeys(addresses):
        denial = _address_denial(policy, rules, candidate, f"'{host}'" if candidate is _LOOPBACK else str(candidate))
        if denial is not None:
            return denial
    regions = policy.options.regions.regions_for(host, address) if policy.residency else set()
    for constraint in policy.residency:
        if not regions:
            return _deny(
                policy,
                "net.residency_unknown",
                constraint.pointer,
                f"the region of '{host}' is unknown; data must stay in {constraint.region}",
                constraint.document,
            )
        outside = sorted(r for r in regions if r != constraint.region)
        if outside:
            return _deny(
                policy,
                "net.residency",
                constraint.pointer,
                f"'{host}' is in region {', '.join(outside)}; data must stay in {constraint.region}",
                constraint.document,
            )
    return Decision(
        "ALLOW",
        (
            Reason(
                "net.allowed",
                pointer("permissions", "network", "allowed_hosts", matched),
                f"'{host}' port {conn.port}/{protocol} is allowed",
            ),
        ),
        _EMPTY,
        policy.digest,
    )


def ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host name denotes by itself: an IPv4 or IPv6 literal (brackets and a zone
    allowed) or one of the numeric IPv4 forms resolvers accept (127.1, 0x7f000001, 2130706433)."""
    if not _MAYBE_LITERAL.match(host):
        return None  # most hosts are names: skip the parsers (and their exceptions)
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        pass
    if _INET_ATON_FORM.match(text):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(text))
        except OSError:
            return None
    return None


def _address_denial(
    policy: Policy, rules: NetworkRules, address: ipaddress.IPv4Address | ipaddress.IPv6Address, label: str
) -> Decision | None:
    cls = classify(address, policy.host_ips, policy.public_test_networks)
    if cls == "metadata":
        return _deny(
            policy,
            "net.metadata_address",
            "/permissions/network/deny_private",
            f"{label} is a cloud metadata address; never reachable",
            "enforcer",
        )
    if cls != "public" and rules.deny_private:
        why = "deny_private is true" if rules.deny_private_explicit else "deny_private defaults to true"
        return _deny(
            policy,
            "net.private_address",
            "/permissions/network/deny_private",
            f"{label} is a {cls.replace('_', ' ')} address and {why}",
        )
    return None


def granted_ports(rules: NetworkRules) -> frozenset[int]:
    """allowed_ports, else the default ports of allowed_protocols."""
    if rules.ports is not None:
        return rules.ports
    return frozenset(p for proto in (rules.protocols or ()) for p in DEFAULT_PORTS.get(proto, ()))


def _protocol_allowed(protocol: str, allowed: frozenset[str]) -> bool:
    return protocol in allowed or ("tcp" in allowed and protocol in _TCP_CARRIED)


# ---- filesystem ------------------------------------------------------------------------------


def normalize_path(path: str) -> str | None:
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path:
        return None
    normal = posixpath.normpath(path)
    return "/" + normal.lstrip("/")  # normpath keeps a leading '//'


def _file(policy: Policy, access: FileAccess) -> Decision:
    rules = policy.filesystem
    if rules is None:
        return _deny(policy, "fs.domain_absent", "/permissions", "no filesystem permission is declared")
    path = normalize_path(access.path)
    if path is None:
        return _deny(policy, "fs.path_invalid", "/permissions/filesystem", f"{access.path!r} is not an absolute path")
    # A denied pattern that names a directory denies everything under it, as the sandbox masks
    # the whole directory: the path or any of its ancestors matching is enough.
    denied = rules.denied.first_covering(path)
    if denied is not None:
        return _deny(
            policy,
            "fs.denied",
            pointer("permissions", "filesystem", "denied_paths", denied),
            f"'{path}' matches, or is inside a directory matching, denied path '{rules.denied.patterns[denied]}'",
        )
    if ".." in access.path.split("/"):
        # The kernel resolves '..' after symlinks ('/data/link/../x' need not be '/data/x'), so
        # only the lexical form is known here: enough to deny, never to allow.
        return _deny(
            policy,
            "fs.not_allowed",
            "/permissions/filesystem/allowed_paths",
            f"{access.path!r} contains '..', which the kernel resolves after symlinks: ask with the resolved path",
        )
    matches = rules.allowed.match(path)
    need = {"read": {"read"}, "write": {"write"}, "read_write": {"read", "write"}}.get(access.mode)
    if need is None:
        return _deny(policy, "fs.mode_invalid", "", f"unknown access mode {access.mode!r}", "enforcer")
    granted: set[str] = set()
    for i in matches:
        grant = rules.access[i]
        granted |= {"read", "write"} if grant == "read_write" else {grant}
        if need <= granted:
            return Decision(
                "ALLOW",
                (
                    Reason(
                        "fs.allowed",
                        pointer("permissions", "filesystem", "allowed_paths", i),
                        f"{access.mode} of '{path}' is allowed",
                    ),
                ),
                _EMPTY,
                policy.digest,
            )
    if matches:
        return _deny(
            policy,
            "fs.mode_not_allowed",
            pointer("permissions", "filesystem", "allowed_paths", matches[0]),
            f"'{path}' is granted {'/'.join(sorted(granted))} only, not {access.mode}",
        )
    return _deny(policy, "fs.not_allowed", "/permissions/filesystem/allowed_paths", f"'{path}' matches no allowed path")


# ---- execution -------------------------------------------------------------------------------


def _exec(policy: Policy, proc: ProcessExec) -> Decision:
    rules = policy.execution
    if rules is None:
        return _deny(policy, "exec.domain_absent", "/permissions", "no execution permission is declared")
    if not proc.argv or not isinstance(proc.argv[0], str) or not proc.argv[0]:
        return _deny(policy, "exec.invalid", "", "empty argv", "enforcer")
    raw = proc.resolved_path or proc.argv[0]
    path = raw
    if raw.startswith("/"):
        # The kernel reads '/usr//bin/curl' and '/usr/bin/./curl' as '/usr/bin/curl'. It resolves
        # '..' after symlinks, so a path with '..' is denied by either spelling, allowed by neither.
        path = normalize_path(raw) or raw
    lexical_only = path != raw and ".." in raw.split("/")
    name = posixpath.basename(path)
    # Ordered (not a set) so the reported reason is the same in every process.
    candidates = tuple(dict.fromkeys((name, path, raw, posixpath.basename(proc.argv[0]))))
    for candidate in candidates:
        hit = rules.denied.first(candidate)
        if hit is not None:
            return _deny(
                policy,
                "exec.denied",
                pointer("permissions", "execution", "denied_commands", hit),
                f"'{candidate}' matches denied command '{rules.denied.patterns[hit]}'",
            )
    if SHELLS.intersection(candidates):
        if not rules.allow_shell:
            return _deny(
                policy,
                "exec.shell",
                "/permissions/execution/allow_shell",
                f"'{name}' is a shell and allow_shell is not true",
            )
        return Decision(
            "ALLOW",
            (Reason("exec.shell_allowed", "/permissions/execution/allow_shell", f"shell '{name}' is allowed"),),
            _EMPTY,
            policy.digest,
        )
    for candidate in candidates:
        hit = rules.allowed.first(candidate)
        if hit is not None and ("/" not in rules.allowed.patterns[hit] or (candidate == path and not lexical_only)):
            return Decision(
                "ALLOW",
                (
                    Reason(
                        "exec.allowed",
                        pointer("permissions", "execution", "allowed_commands", hit),
                        f"'{candidate}' is an allowed command",
                    ),
                ),
                _EMPTY,
                policy.digest,
            )
    return _deny(
        policy, "exec.not_allowed", "/permissions/execution/allowed_commands", f"'{name}' matches no allowed command"
    )


# ---- environment -----------------------------------------------------------------------------


def _env(policy: Policy, var: EnvVar) -> Decision:
    rules = policy.environment
    if rules is None:
        return _deny(policy, "env.domain_absent", "/permissions", "no environment permission is declared")
    denied = rules.denied.first(var.name)
    if denied is not None:
        return _deny(
            policy,
            "env.denied",
            pointer("permissions", "environment", "denied_variables", denied),
            f"'{var.name}' matches denied variable '{rules.denied.patterns[denied]}'",
        )
    allowed = rules.allowed.first(var.name)
    if allowed is None:
        return _deny(
            policy,
            "env.not_allowed",
            "/permissions/environment/allowed_variables",
            f"'{var.name}' matches no allowed variable",
        )
    return Decision(
        "ALLOW",
        (
            Reason(
                "env.allowed",
                pointer("permissions", "environment", "allowed_variables", allowed),
                f"'{var.name}' is allowed",
            ),
        ),
        _EMPTY,
        policy.digest,
    )
