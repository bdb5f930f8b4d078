"""The signed per-session enforcement record in the shape of ADL 0.3's draft
`schema-enforcement-record.json`. Pure apart from the signing key handed in.

Interpretation of points the draft leaves open:
- tier: R3 when every declared domain was kernel-enforced, R2 when some domain was accepted as
  unenforced, R1 for sessions the enforcer only answered decisions for (no sandbox).
- events are hash-chained as the schema describes: `prev_hash` is the base64url SHA-256 of the JCS
  form of the previous event, or of the record header (every member except events, outcome,
  signature, limits, iat, nonce) for the first one.
- the signature is Ed25519 over the JCS form of the record without its `signature` member.
"""

from __future__ import annotations

import hashlib
from typing import Any

import rfc8785
from cryptography.hazmat.primitives.asymmetric import ed25519

from ..quick_dataclass import dataclass
from .keys import b64url, signature_ok

HEADER_MEMBERS = ("adl_enforcement_record", "governor", "subject", "session", "tier", "window")
ACTIONS = ("halt", "pause", "fallback", "continue")


@dataclass(frozen=True)
class EvidenceEvent:
    cause: str  # on_<snake_case>, e.g. on_deny, on_timeout, on_oom
    action: str  # halt | pause | fallback | continue
    at: str  # RFC 3339
    detail: Any = None


def _digest(value: Any) -> str:
    return b64url(hashlib.sha256(rfc8785.dumps(value)).digest())


def build_evidence(
    *,
    governor: str,
    agent_id: str,
    passport_digest: str,
    session: str,
    tier: str,
    start: str,
    end: str,
    iat: str,
    limits: dict[str, Any],
    events: list[EvidenceEvent],
    outcome: str,
    key: ed25519.Ed25519PrivateKey,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "adl_enforcement_record": "1.0",
        "governor": governor,
        "subject": {"id": agent_id, "passport_digest": passport_digest},
        "session": session,
        "tier": tier,
        "window": {"start": start, "end": end},
        "iat": iat,
        "limits": limits,
    }
    prev = _digest({k: record[k] for k in HEADER_MEMBERS})
    chained = []
    for seq, event in enumerate(events):
        item: dict[str, Any] = {
            "seq": seq,
            "cause": event.cause,
            "action": event.action,
            "at": event.at,
            "prev_hash": prev,
        }
        if event.detail is not None:
            item["detail"] = event.detail
        chained.append(item)
        prev = _digest(item)
    record["events"] = chained
    record["outcome"] = outcome
    record["signature"] = {
        "algorithm": "Ed25519",
        "value": b64url(key.sign(rfc8785.dumps(record))),
        "signed_content": "canonical",
    }
    return record


def evidence_problem(record: dict[str, Any], key: ed25519.Ed25519PublicKey) -> str | None:
    """Why an evidence record does not verify, or None."""
    try:
        body = {k: v for k, v in record.items() if k != "signature"}
        if not signature_ok(key, record["signature"]["value"], rfc8785.dumps(body)):
            return "signature does not verify"
        prev = _digest({k: record[k] for k in HEADER_MEMBERS})
        for event in record["events"]:
            if event.get("prev_hash") != prev:
                return f"event {event.get('seq')} is not chained to the one before it"
            prev = _digest(event)
    except (KeyError, TypeError, AttributeError) as exc:
        return f"malformed evidence record: {exc}"
    return None
