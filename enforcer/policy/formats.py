"""String formats the ADL drafts require: ISO 8601 timestamps with zone, RFC 3986 URIs, ADL URNs."""

from __future__ import annotations

import re
from datetime import UTC, datetime

_TIMESTAMP = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}(:\d{2}(\.\d{1,9})?)?([Zz]|[+-]\d{2}:?\d{2})$")
# RFC 3986 absolute URI: scheme ":" hier-part, only unreserved/reserved/pct-encoded characters.
_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*$")
_PCT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_SEMVER = r"\d+\.\d+\.\d+"
# Agent URNs end in a semver; MAJOR.MINOR is accepted too because the spec's own portfolio
# examples use it. The {type} segment (agent | profile) is what VAL-37 is about.
_ADL_URN = re.compile(
    rf"^urn:adl:(agent:[a-z0-9]+:[a-z0-9][a-z0-9-]*:(\d+\.\d+|{_SEMVER})"
    r"|profile:[a-z0-9][a-z0-9-]*:\d+\.\d+(\.\d+)?)$"
)


def parse_timestamp(value: object) -> datetime | None:
    """An aware UTC datetime for a valid ISO 8601 timestamp with timezone, else None."""
    if not isinstance(value, str) or not _TIMESTAMP.match(value):
        return None
    text = value.replace("z", "Z").replace("t", "T")
    # fromisoformat accepts at most 6 fractional digits; nanoseconds are truncated, not rejected.
    match = re.match(r"^(.*\.\d{6})\d+(.*)$", text)
    if match:
        text = match.group(1) + match.group(2)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed.astimezone(UTC) if parsed.tzinfo else None


def is_uri(value: object) -> bool:
    return isinstance(value, str) and bool(_URI.match(value)) and not _PCT.search(value)


def is_adl_urn(value: object) -> bool:
    return isinstance(value, str) and bool(_ADL_URN.match(value))
