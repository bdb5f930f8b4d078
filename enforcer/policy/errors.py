"""Structured errors in the ADL draft's format: {"code","title","detail","source":{"pointer"}}.

Codes ADL-xxxx are the draft's (ADL 0.1-0.3 section "Error Codes"). Codes the drafts do not define
but an enforcer needs (input limits, AAIF findings, enforcer warnings) use the ENF- and AAIF-
prefixes so they can never be confused with a spec code.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Literal

from ..quick_dataclass import dataclass

TITLES: dict[str, str] = {
    "ADL-1001": "Invalid JSON",
    "ADL-1002": "Document is not a JSON object",
    "ADL-1003": "Missing required member",
    "ADL-1004": "Invalid member type",
    "ADL-1005": "Invalid enum value",
    "ADL-1006": "Value does not match pattern",
    "ADL-2001": "Unsupported ADL version",
    "ADL-2002": "Duplicate tool name",
    "ADL-2003": "Duplicate resource name",
    "ADL-2004": "Duplicate prompt name",
    "ADL-2005": "Invalid timestamp format",
    "ADL-2006": "Invalid URI format",
    "ADL-2007": "Invalid JSON Schema",
    "ADL-2008": "Invalid tool name pattern",
    "ADL-2009": "Invalid resource type value",
    "ADL-2010": "Temperature out of range",
    "ADL-2011": "Invalid authentication type",
    "ADL-2012": "Invalid attestation type",
    "ADL-2013": "Invalid error handling action",
    "ADL-2014": "Invalid output format",
    "ADL-2015": "Invalid model capability",
    "ADL-2016": "Invalid host pattern syntax",
    "ADL-2017": "Invalid filesystem path pattern",
    "ADL-2018": "Invalid environment variable pattern",
    "ADL-2019": "Missing digest fields for digest-mode signature",
    "ADL-2020": "Invalid data classification sensitivity level",
    "ADL-2021": "Invalid data classification category",
    "ADL-2022": "Retention min_days exceeds max_days",
    "ADL-2023": "High-water mark violation",
    "ADL-2024": "Undefined template variable",
    "ADL-2025": "Invalid ADL URN",
    "ADL-3001": "Profile requirements not satisfied",
    "ADL-3002": "Unknown profile",
    "ADL-4001": "Weak key algorithm",
    "ADL-4002": "Invalid signature",
    "ADL-4003": "Expired attestation",
    "ADL-5001": "Invalid lifecycle status value",
    "ADL-5002": "Successor present on non-retired agent",
    "ADL-5003": "Sunset date in the past with non-retired status",
    "ADL-6001": "Resource-limit budget cap not greater than zero",
    "ADL-6002": "Budget per_session exceeds per_day",
    "ADL-6003": "Invalid degradation response action",
    "ADL-6004": "Invalid tool-invocation iteration limit",
    "ADL-6005": "Invalid loop-detection window",
    "ADL-6006": "Invalid sub-agent pattern syntax",
    "ADL-6007": "Invalid sub-agent max_depth",
    "ADL-6008": "Invalid degradation cause key",
    "ADL-6009": "Invalid sub-agent declaration",
    # Enforcer-specific: input limits and I/O.
    "ENF-1001": "Document too large",
    "ENF-1002": "Document nested too deeply",
    "ENF-1003": "Too many entries",
    "ENF-1004": "Unreadable document",
    "ENF-1005": "Unknown document kind",
    "ENF-1006": "Specification files not found",
    "ENF-1007": "Number outside the interoperable range",
    # Enforcer-specific: policy compilation.
    "ENF-2001": "Inline credential",
    "ENF-2002": "Unsupported condition",
    "ENF-2003": "Broad wildcard permission",
    "ENF-2004": "Permission cannot take effect",
    "ENF-2005": "Documents describe different agents",
    "ENF-2006": "Signature required",
    "ENF-2007": "Lifecycle warning",
    "ENF-2008": "Attestation near expiry",
    "ENF-2009": "Non-deterministic condition",
    "ENF-2010": "Required capability not provided",
    "ENF-2011": "Pattern grants other than it looks",
    # AAIF (SC-006) schema findings.
    "AAIF-1001": "AAIF schema violation",
}

Severity = Literal["error", "warning"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One validation or compilation finding; `pointer` is an RFC 6901 JSON Pointer."""

    code: str
    detail: str
    pointer: str = ""
    severity: Severity = "error"
    title: str = field(default="")

    def __post_init__(self) -> None:
        if not self.title:
            object.__setattr__(self, "title", TITLES.get(self.code, self.code))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "code": self.code,
            "title": self.title,
            "detail": self.detail,
            "source": {"pointer": self.pointer},
        }
        if self.severity != "error":
            out["severity"] = self.severity
        return out


def pointer(*parts: str | int) -> str:
    """Build a JSON Pointer from path parts, escaping '~' and '/' per RFC 6901."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


class Refusal(Exception):
    """What makes a load or a launch refuse: the documents, the files they are in or the plan built
    from them. Launchers and the policy store catch this one base; its message says what and why."""


class DocumentRejected(Refusal):
    """Raised by the compile entry points when a document has errors; carries all of them."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        errors = [f for f in findings if f.severity == "error"]
        first = errors[0] if errors else (findings[0] if findings else None)
        summary = f"{first.code} {first.title}: {first.detail}" if first else "document rejected"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        super().__init__(summary + more)

    def to_json(self) -> dict[str, Any]:
        return {"errors": [f.to_json() for f in self.findings if f.severity == "error"]}
