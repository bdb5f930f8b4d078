"""AAIF (SC-006) documents: schema validation, inline credentials, conditions, compliance."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .adl import schema_problem
from .conditions import UnsupportedCondition, compile_condition
from .credentials import find_inline_credentials
from .errors import Finding, pointer
from .jsonvalues import arr, obj
from .specs import SchemaSet, SpecMissing


def schema_file_for(document: dict[str, Any]) -> str:
    declared = document.get("x-sc-schema")
    return declared if isinstance(declared, str) else "agent.schema.json"


def validate_aaif(document: dict[str, Any], schemas: SchemaSet) -> list[Finding]:
    """Schema errors (format annotations are not asserted) and inline credentials."""
    schema_file = schema_file_for(document)
    try:
        accepted = schemas.aaif_accepts(schema_file, document)
    except SpecMissing:
        if schema_file == "agent.schema.json":
            raise  # the installation lacks the specification, not a document fault
        # A document names its schema; one this enforcer does not have is a finding, not a crash.
        return [Finding("AAIF-1001", f"x-sc-schema {schema_file!r} is not a published AAIF schema", "/x-sc-schema")]
    findings = [] if accepted else _schema_findings(schemas.aaif_validator(schema_file), document)
    findings.extend(find_inline_credentials(document))
    for i, tool in enumerate(arr(obj(document.get("agent")).get("tools"))):
        for key in ("parameters_schema", "output_schema"):
            schema = tool.get(key) if isinstance(tool, dict) else None
            problem = schema_problem(schema, enforced=key == "parameters_schema") if isinstance(schema, dict) else None
            if problem:
                findings.append(
                    Finding(
                        "ADL-2007", f"invalid JSON Schema: {problem[0]}", pointer("agent", "tools", i, key, *problem[1])
                    )
                )
    return findings


def _schema_findings(validator: Any, document: dict[str, Any]) -> list[Finding]:
    from .schema_errors import iter_leaf_errors

    return [
        Finding("AAIF-1001", f"{error.validator}: {error.message}", pointer(*error.absolute_path))
        for error in iter_leaf_errors(validator, document)
    ]


# The AAIF capabilities (registries/capabilities.json) this enforcer itself provides: approval
# gates (ASK), the tamper-evident audit log, residency checks on every connection, and
# deterministic evaluation of structured conditions. Whatever else an agent requires (tool
# protocols, memory backends, streaming, checkpoints) is the agent runtime's to provide; an
# operator states those with CompileOptions.runtime_capabilities.
PROVIDED_CAPABILITIES = frozenset(
    {"compliance.hitl", "compliance.audit_log", "compliance.data_residency", "condition.structured"}
)


def capability_findings(document: dict[str, Any], provided: frozenset[str] = PROVIDED_CAPABILITIES) -> list[Finding]:
    """AAIF §7: every required capability is checked; an unsatisfied one is rejected at strict,
    rejected at regulated (the launcher audits every refusal), disabled with a warning at standard
    and warned about at minimal."""
    safety_level = safety_level_of(document)
    out: list[Finding] = []
    for i, capability in enumerate(arr(obj(document.get("agent")).get("required_capabilities"))):
        if isinstance(capability, str) and capability in provided:
            continue
        if safety_level in ("strict", "regulated"):
            severity, consequence = "error", f"rejected at safety_level '{safety_level}'"
        elif safety_level == "minimal":
            severity, consequence = "warning", "warned only"
        else:
            severity, consequence = "warning", "capability disabled: the agent runs without it"
        out.append(
            Finding(
                "ENF-2010",
                f"required capability {capability!r} is not provided by this enforcer or the declared runtime "
                f"(provided: {', '.join(sorted(provided))}) ({consequence})",
                pointer("agent", "required_capabilities", i),
                severity,  # type: ignore[arg-type]
            )
        )
    return out


def compliance_of(document: dict[str, Any]) -> dict[str, Any]:
    return obj(obj(document.get("agent")).get("compliance"))


def safety_level_of(document: dict[str, Any]) -> str:
    return str(compliance_of(document).get("safety_level", "standard"))


def iter_conditions(document: dict[str, Any]) -> Iterator[tuple[Any, tuple[str | int, ...]]]:
    """Every condition in an agent document: subagents[].when, handoff[].condition,
    events.triggers[].filter, compliance.human_in_the_loop.trigger."""
    agent = obj(document.get("agent"))
    orchestration = obj(agent.get("orchestration"))
    for i, sub in enumerate(arr(orchestration.get("subagents"))):
        if isinstance(sub, dict) and "when" in sub:
            yield sub["when"], ("agent", "orchestration", "subagents", i, "when")
    for i, hand in enumerate(arr(orchestration.get("handoff"))):
        if isinstance(hand, dict) and "condition" in hand:
            yield hand["condition"], ("agent", "orchestration", "handoff", i, "condition")
    for i, trig in enumerate(arr(obj(agent.get("events")).get("triggers"))):
        if isinstance(trig, dict) and "filter" in trig:
            yield trig["filter"], ("agent", "events", "triggers", i, "filter")
    hitl = obj(compliance_of(document).get("human_in_the_loop"))
    if "trigger" in hitl:
        yield hitl["trigger"], ("agent", "compliance", "human_in_the_loop", "trigger")


def condition_findings(document: dict[str, Any]) -> list[Finding]:
    """What each condition that cannot be evaluated means at this safety level.

    minimal: warning; standard: warning, the condition is disabled (a disabled approval trigger
    gates every tool call, it never lets calls through); strict and regulated: the document is
    rejected.
    """
    safety_level = safety_level_of(document)
    out: list[Finding] = []
    for condition, path in iter_conditions(document):
        if isinstance(condition, str):
            out.append(
                Finding(
                    "ENF-2009",
                    f"natural-language condition {condition!r} is a hint, not an expression; it is not portable",
                    pointer(*path),
                    "warning",
                )
            )
            continue
        try:
            compile_condition(condition)
        except UnsupportedCondition as exc:
            severity = "error" if safety_level in ("strict", "regulated") else "warning"
            consequence = {"minimal": "warned only", "standard": "condition disabled"}.get(
                safety_level, f"rejected at safety_level '{safety_level}'"
            )
            out.append(Finding("ENF-2002", f"{exc} ({consequence})", pointer(*path), severity))  # type: ignore[arg-type]
    return out
