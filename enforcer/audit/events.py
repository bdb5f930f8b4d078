"""Payloads for the records the enforcer writes. Pure: no I/O.

Every payload puts the facets reviewers filter on at its top level: `agent`, `decision`, `tool`,
`host`, `path`, `command`, `rules`. `adl-audit` relies on exactly these names.
"""

from __future__ import annotations

from collections.abc import Mapping
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
