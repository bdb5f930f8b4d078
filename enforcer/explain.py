"""Human-readable and JSON views of a compiled Policy (shared by adl-policy and adl-exec)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .policy import Policy, presets
from .text import printable


def policy_summary(policy: Policy) -> dict[str, Any]:
    net, fs, env, ex, lim = policy.network, policy.filesystem, policy.environment, policy.execution, policy.limits
    return {
        "agent": {
            "name": policy.agent_name,
            "id": policy.agent_id,
            "version": policy.agent_version,
            "adl_spec": policy.adl_spec,
        },
        "digest": policy.digest,
        "sensitivity": policy.sensitivity,
        "signature": policy.signature,
        "lifecycle": {
            "status": policy.lifecycle.status,
            "verdict": policy.lifecycle.verdict,
            "reason": policy.lifecycle.reason,
        },
        "tools": [
            {
                "name": t.name,
                "requires_confirmation": t.requires_confirmation,
                "read_only": t.read_only,
                "schema_checked": bool(t.validators),
                "auth_env_var": t.auth_env_var,
            }
            for t in policy.tools.values()
        ],
        "network": None
        if net is None
        else {
            "allowed_hosts": list(net.hosts.patterns),
            "allowed_ports": sorted(net.ports) if net.ports is not None else None,
            "allowed_protocols": sorted(net.protocols) if net.protocols is not None else None,
            "deny_private": net.deny_private,
        },
        "filesystem": None
        if fs is None
        else {
            "allowed_paths": [{"path": p, "access": a} for p, a in zip(fs.allowed.patterns, fs.access, strict=True)],
            "denied_paths": list(fs.denied.patterns),
        },
        "environment": None
        if env is None
        else {"allowed_variables": list(env.allowed.patterns), "denied_variables": list(env.denied.patterns)},
        "execution": None
        if ex is None
        else {
            "allowed_commands": list(ex.allowed.patterns),
            "denied_commands": list(ex.denied.patterns),
            "allow_shell": ex.allow_shell,
        },
        "resource_limits": None
        if lim is None
        else {
            "max_memory_mb": lim.max_memory_mb,
            "max_cpu_percent": lim.max_cpu_percent,
            "max_duration_sec": lim.max_duration_sec,
            "max_concurrent": lim.max_concurrent,
        },
        "approval": None
        if policy.approval is None
        else {
            "mode": policy.approval.mode,
            "source": policy.approval.source,
            "timeout_seconds": policy.approval.timeout_seconds,
        },
        "residency": [{"region": r.region, "from": r.document, "pointer": r.pointer} for r in policy.residency],
        "pii_handling": policy.pii_mode,
        "audit_required": policy.audit_required,
        "safety_level": policy.safety_level,
        "warnings": [w.to_json() for w in policy.warnings],
    }


def explained(policy: Policy, runtime_presets: Sequence[str]) -> dict[str, Any]:
    """The effective policy as JSON, as `adl-policy explain --json` prints it and the daemon's
    Explain answers it: policy_summary and what the runtime presets the document enables grant
    (`runtime_presets`: preset_details' lines, which render_policy shows as text)."""
    return {**policy_summary(policy), "runtime_presets": list(runtime_presets)}


def preset_details(
    catalog: presets.Catalog, names: tuple[str, ...], chosen: Sequence[presets.Preset]
) -> tuple[dict[str, str], list[str]]:
    """What the runtime presets `chosen` (named `names`) add on this host: the variables they set,
    and the lines adl-exec --explain and adl-policy explain both show for them."""
    env: dict[str, str] = {}
    details = [f"presets {', '.join(names)} from {catalog.source} ({catalog.digest[:19]}…)"]
    for preset in chosen:
        granted = [p for p in (*preset.read, *preset.read_write, *preset.execute) if os.path.exists(p)]
        details.append(f"  {preset.name}: {preset.description}")
        if granted:
            details.append(f"    paths: {', '.join(granted)}")
        for var, candidates in preset.env.items():
            # Values are paths when they look like paths: the first that exists on this host.
            paths = [c for c in candidates if c.startswith("/")]
            value = next((c for c in paths if os.path.exists(c)), None) if paths else candidates[0]
            if value is not None:
                env[var] = value
                details.append(f"    env {var}={value}")
        if preset.session_tmp:
            details.append("    TMPDIR, TMP, TEMP: a directory of the session's own under /tmp, removed at exit")
    return env, details


def _fmt(values: list[Any] | None, empty: str = "(none)") -> str:
    if values is None:
        return "(absent)"
    return ", ".join(str(v) for v in values) if values else empty


def render_policy(policy: Policy, runtime_presets: Sequence[str] = ()) -> str:
    """The effective policy; `runtime_presets`: preset_details' lines for the presets the document
    enables, which grant beyond its permissions."""
    s = policy_summary(policy)
    agent = s["agent"]
    denied = "DENIED (domain absent)"
    lines = [
        f"Agent        {agent['name']} {agent['version'] or ''} (ADL {agent['adl_spec']})".rstrip(),
        f"Id           {agent['id'] or '-'}",
        f"Digest       sha256:{s['digest']}",
        f"Sensitivity  {s['sensitivity']}    signature: {s['signature']}",
        f"Lifecycle    {s['lifecycle']['verdict'].upper()}: {s['lifecycle']['reason']}",
        "",
        "Domain        Effective permission",
        "------------  --------------------------------------------------------------",
    ]
    net = s["network"]
    if net is None:
        lines.append(f"network       {denied}: no connection can be made")
    else:
        lines += [
            f"network       hosts: {_fmt(net['allowed_hosts'])}",
            f"              ports: {_fmt(net['allowed_ports'])}   protocols: {_fmt(net['allowed_protocols'])}",
            "              private/loopback/link-local addresses: "
            f"{'denied' if net['deny_private'] else 'allowed'}; cloud metadata: always denied",
        ]
    fs = s["filesystem"]
    if fs is None:
        lines.append(f"filesystem    {denied}")
    else:
        for entry in fs["allowed_paths"] or [{"path": "(none)", "access": ""}]:
            lines.append(f"filesystem    {entry['access']:<10} {entry['path']}")
        for path in fs["denied_paths"]:
            lines.append(f"              {'DENY':<10} {path}")
    env = s["environment"]
    lines.append(
        f"environment   {denied}: the agent starts with an empty environment"
        if env is None
        else f"environment   allow: {_fmt(env['allowed_variables'])}   deny: {_fmt(env['denied_variables'])}"
    )
    ex = s["execution"]
    lines.append(
        f"execution     {denied}"
        if ex is None
        else f"execution     allow: {_fmt(ex['allowed_commands'])}   deny: {_fmt(ex['denied_commands'])}   "
        f"shells: {'allowed' if ex['allow_shell'] else 'denied'}"
    )
    lim = s["resource_limits"]
    lines.append(
        "limits        (none declared)"
        if lim is None
        else "limits        " + "  ".join(f"{k}={v}" for k, v in lim.items() if v is not None)
    )
    if runtime_presets:
        lines.append("presets       runtime presets (ADL extension adl-enforcer.runtime) add to the above:")
        lines += [f"              {line}" for line in runtime_presets]
    lines.append("")
    lines.append(f"Tools ({len(s['tools'])}; any other tool is denied)")
    for tool in s["tools"]:
        flags = [
            f
            for f, on in (
                ("ASK: requires confirmation", tool["requires_confirmation"]),
                ("read-only", tool["read_only"]),
                ("arguments schema-checked", tool["schema_checked"]),
            )
            if on
        ]
        if tool["auth_env_var"]:
            flags.append(f"secret from ${tool['auth_env_var']}")
        lines.append(f"  {tool['name']:<28} {'; '.join(flags)}")
    approval = s["approval"]
    gate = (
        "none" if approval is None else f"{approval['source']} (timeout {approval['timeout_seconds']} s, expiry denies)"
    )
    regions = _fmt([f"{r['region']} ({r['from']})" for r in s["residency"]], "no restriction")
    audit = "required: the agent stops if the log cannot be written" if s["audit_required"] else "best effort"
    lines += [
        "",
        "Compliance",
        f"  human approval   {gate}",
        f"  data residency   {regions}",
        f"  PII handling     {s['pii_handling']}",
        f"  audit log        {audit}",
        f"  safety level     {s['safety_level']}",
    ]
    if s["warnings"]:
        lines += ["", f"Warnings ({len(s['warnings'])})"]
        lines += [f"  {w['code']} {w['source']['pointer'] or '/'}: {w['detail']}" for w in s["warnings"]]
    # The document's author chose its names and texts: a control sequence in one (conceal, cursor
    # moves) could hide or rewrite the lines after it on the reader's terminal.
    return "\n".join(printable(line) for line in lines)
