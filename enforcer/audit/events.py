"""Payloads for the records the enforcer writes. Pure: no I/O.

Every payload puts the facets reviewers filter on at its top level: `agent`, `decision`, `tool`,
`host`, `path`, `command`, `rules`. `adl-audit` relies on exactly these names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..policy.jsonvalues import Path
from ..policy.model import Action, Decision, EnvVar, FileAccess, NetworkConnect, Policy, ProcessExec, ToolCall
from ..policy.pii import Spans
from .masking import Masker


def agent_of(policy: Policy) -> str:
    return policy.agent_id or policy.agent_name


def action_facets(action: Action, masker: Masker, pii: Mapping[Path, Spans] | None = None) -> dict[str, Any]:
    """`pii`: scan_leaves() of a tool call's arguments, when the caller has scanned them already."""
    if isinstance(action, ToolCall):
        masked = masker.mask(action.arguments, pii=pii)
        facets: dict[str, Any] = {
            "action": "tool",
            "tool": action.name,
            "args": masked.value,
            "args_digest": masked.digest,
        }
        if masked.pointers:
            facets["masked"] = list(masked.pointers)
        return facets
    if isinstance(action, NetworkConnect):
        return {
            "action": "network",
            "host": action.host,
            "port": action.port,
            "protocol": action.protocol,
            "address": action.address,
        }
    if isinstance(action, FileAccess):
        return {"action": "file", "path": action.path, "mode": action.mode}
    if isinstance(action, ProcessExec):
        argv = masker.mask(list(action.argv))
        facets = {"action": "exec", "command": action.argv[0] if action.argv else "", "argv": argv.value}
        if argv.pointers:
            facets["masked"] = list(argv.pointers)
        return facets
    if isinstance(action, EnvVar):
        return {"action": "env", "variable": action.name}
    raise TypeError(f"unknown action {type(action).__name__}")


def decision_members(policy: Policy, decision: Decision) -> dict[str, Any]:
    """The members of a decision record that follow from the decision alone."""
    return {
        "agent": agent_of(policy),
        "decision": decision.verdict.lower(),
        "rules": [r.rule for r in decision.reasons],
        "reasons": [r.to_json() for r in decision.reasons],
        "obligations": dict(decision.obligations),
        "policy_digest": decision.policy_digest,
    }


def decision_payload(policy: Policy, action: Action, decision: Decision, masker: Masker) -> dict[str, Any]:
    return {**decision_members(policy, decision), **action_facets(action, masker)}


# -- records of the egress filter and of kernel denials --------------------------------------------


def one_rule(decision: str, rule: str, text: str, pointer: str | None = None) -> dict[str, Any]:
    """The decision members of a record that one rule decided (`rules` and `reasons` name it)."""
    reason = {"rule": rule, "text": text}
    if pointer:
        reason["pointer"] = pointer
    return {"decision": decision, "rules": [rule], "reasons": [reason]}


DENIAL_TALLY_FACETS = ("mechanism", "access", "path", "port", "syscall", "command")


def denial_tally(count: int, first: Mapping[str, Any], *, with_grant: bool = False) -> dict[str, Any]:
    """One line of a kernel-denial summary: how often a denial recurred, described by the record
    payload of its first occurrence (`first`)."""
    tally: dict[str, Any] = {
        "count": count,
        **{k: first.get(k) for k in DENIAL_TALLY_FACETS},
        "rule": (first.get("rules") or ["kernel.denied"])[0],
        "hint": first.get("hint"),
    }
    if with_grant:
        tally["grant"] = first.get("grant")
    return tally


# ---- a session's records: launch, refusal, guard decisions, exit, evidence ----------------------


def caller_fields(uid: int, cwd: str | None) -> dict[str, Any]:
    """Who asked the daemon for a session, and the working directory: added to its launch and
    refusal records."""
    return {"caller_uid": uid, "cwd": cwd}


def refused_members(reason: str) -> dict[str, Any]:
    """What every `refused` record says: a denied action (`adl-audit search --decision deny` finds
    it) and why."""
    return {"decision": "deny", "reason": "refused", "refusal": reason}


def refusal_payload(policy: Policy | None, reason: str, argv: Sequence[str]) -> dict[str, Any]:
    """A launch that was refused, before or while its sandbox was set up."""
    payload = {**refused_members(reason), "argv": Masker().mask(list(argv)).value}
    if policy is not None:
        payload.update(agent=agent_of(policy), policy_digest=policy.digest)
    return payload


def launch_payload(
    policy: Policy,
    masker: Masker,
    *,
    argv: Sequence[str],
    command: str,
    layers: list[dict[str, Any]],
    accepted_unenforced: Sequence[str],
    baseline_path: str,
    baseline_digest: str,
    env_passed: Iterable[str],
    env_dropped: Sequence[str],
    uid: int,
    gid: int,
) -> dict[str, Any]:
    """The launch record, written before the agent starts: what runs, as whom, under which layers.
    `masker` knows the secret values handed to the agent: they never reach the log."""
    return {
        "agent": agent_of(policy),
        "decision": "allow",
        "policy_digest": policy.digest,
        "argv": masker.mask(list(argv)).value,
        "command": command,
        "layers": layers,
        "accepted_unenforced": list(accepted_unenforced),
        "baseline": {"path": baseline_path, "digest": baseline_digest},
        "env_passed": sorted(env_passed),
        "env_dropped": list(env_dropped),
        "uid": uid,
        "gid": gid,
    }


def guard_refusal_payload(policy: Policy, refusal: Mapping[str, Any]) -> dict[str, Any]:
    """A name the creation guard refused to create (seccomp user notification), as a deny decision."""
    return {
        "agent": agent_of(policy),
        "decision": "deny",
        "enforced_by": "creation guard (seccomp user notification)",
        "syscall": refusal.get("syscall"),
        "path": refusal.get("path"),
        "pid": refusal.get("pid"),
        "rules": ["fs.denied"],
        "reasons": [{"rule": "fs.denied", "text": f"new name matches denied path '{refusal.get('pattern')}'"}],
    }


def exit_payload(
    policy: Policy,
    *,
    reason: str,
    exit_code: int,
    signal: int | None,
    duration_s: float,
    pid: int,
    creations_refused: int,
    creations_recorded: int,
    kernel_denials: Mapping[str, Any],
    network: Mapping[str, Any] | None = None,
    cleanup_error: str | None = None,
) -> dict[str, Any]:
    """The exit record. `creations_recorded`: how many of the refused creations have a record of
    their own; `kernel_denials`: the session's denials summary (its `top` list stays out)."""
    return {
        "agent": agent_of(policy),
        "reason": reason,
        "exit_code": exit_code,
        "signal": signal,
        "duration_ms": int(duration_s * 1000),
        "pid": pid,
        "creations_refused": creations_refused,
        "creations_refused_unrecorded": creations_refused - creations_recorded,
        **({"network": dict(network)} if network is not None else {}),
        **({"cleanup_error": cleanup_error} if cleanup_error else {}),
        "kernel_denials": {k: v for k, v in kernel_denials.items() if k != "top"},
    }


def exit_priority(reason: str) -> str:
    """A session that did not end by itself is worth a reviewer's attention."""
    return "normal" if reason == "exit" else "high"


def evidence_payload(policy: Policy, evidence: Mapping[str, Any]) -> dict[str, Any]:
    return {"agent": agent_of(policy), "evidence": evidence}
