"""Inline credentials: secrets written into a policy document instead of referenced by name."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .errors import Finding, pointer
from .jsonvalues import iter_strings, member_name

# Member names whose string value would be a secret itself (not the *name* of one).
_SECRET_NAME = re.compile(
    r"(^|_)(password|passwd|passphrase|secret|client_secret|token|access_token|refresh_token|api_key|apikey"
    r"|access_key|secret_key|private_key|credential|credentials|bearer)$",
    re.IGNORECASE,
)
# Members that hold the name of a secret or a header, never its value.
_REFERENCE_MEMBERS = {
    "env_var",
    "header",
    "trace_context_header",
    "key",
    "path",
    "provider",
    "type",
    "version",
    "token_endpoint",
    "description",
    "nl",
    "name",
    "algorithm",
}
# Each pattern consumes a character it needs before it looks behind for the word boundary
# (`A(?<!\wA)KIA` is `\bAKIA`). Led by `\b`, a pattern gives the regex engine no first character to
# skip to, so it tries every position.
# tests/unit/test_scan_patterns.py holds each equal to its plain form.
_SECRET_VALUES = {
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "AWS access key": r"A(?<!\wA)(?:KIA|SIA)[0-9A-Z]{16}\b",
    "GitHub token": r"g(?<!\wg)h[pousr]_[A-Za-z0-9]{30,}\b",
    "Slack token": r"x(?<!\wx)ox[abprs]-[A-Za-z0-9-]{10,}",
    "API secret key": r"s(?<!\ws)k-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",
    "Google API key": r"A(?<!\wA)Iza[0-9A-Za-z_-]{35}\b",
    "JSON Web Token": r"e(?<!\we)yJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "bearer credential": r"B(?<!\wB)(?:earer|asic)\s+[A-Za-z0-9+/=._-]{16,}",
}
# All of the above in one pattern: most values match none, and one search is cheaper than eight. The
# engine tries every character that can start one of them, and "s" (sk-) and "e" (eyJ) are common
# in ordinary text. Here those two, and the private key, start at a rarer character inside them and
# look behind for the rest.
# Only whether it matches is used. tests/unit/test_scan_patterns.py holds it finding a secret exactly
# when one of the patterns above does.
_RARER_START = {
    "private key": r"N(?<=-----BEGIN) [A-Z ]*PRIVATE KEY-----",
    "API secret key": r"k(?<=(?<!\w)sk)-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}",
    "JSON Web Token": r"J(?<=(?<!\w)eyJ)[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
}
_ANY_SECRET_VALUE = re.compile(
    "|".join(f"(?:{_RARER_START.get(label, pattern)})" for label, pattern in _SECRET_VALUES.items())
)
_SECRET_QUERY = re.compile(r"^(api[_-]?key|key|token|access_token|secret|password|sig|signature)$", re.IGNORECASE)


@functools.cache
def secret_value_patterns() -> tuple[tuple[str, re.Pattern[str]], ...]:
    """Each kind of secret value, compiled: only to name the kind once _ANY_SECRET_VALUE has found
    one (compiling them all costs a launch, which masks its argv here, more than the search does)."""
    return tuple((label, re.compile(pattern)) for label, pattern in _SECRET_VALUES.items())


def find_inline_credentials(document: Any) -> Iterator[Finding]:
    for path, value in iter_strings(document):
        reason = credential_reason(member_name(path), value) if value else None
        if reason:
            yield Finding(
                "ENF-2001",
                f"{reason}; reference secrets by name (auth.env_var or a vault reference), never inline",
                pointer(*path),
            )


def credential_reason(member: str, value: str) -> str | None:
    if member not in _REFERENCE_MEMBERS and _SECRET_NAME.search(member) and not value.startswith(("$", "${")):
        return f"member '{member}' carries a secret value"
    if _ANY_SECRET_VALUE.search(value):
        for label, pattern in secret_value_patterns():  # the first kind in the list names it, as before
            if pattern.search(value):
                return f"value looks like a {label}"
    if "://" in value:
        try:
            parts = urlsplit(value)
        except ValueError:
            return None
        if parts.password:
            return "URL carries a password"
        if any(_SECRET_QUERY.match(k) and v for k, v in parse_qsl(parts.query)):
            return "URL query carries a credential"
    return None
