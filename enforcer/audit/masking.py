"""Masking of secrets and PII before anything reaches the audit log. Pure: no I/O.

A string leaf that is, or contains, a secret (a known secret value handed to the sandbox, a member
named like a secret, a token-shaped value) is replaced whole; PII inside a string (emails, phone
numbers, cards, IBANs, national ids) is replaced span by span so the rest stays readable. Every
masked leaf is named by JSON Pointer, and the SHA-256 of the canonical unmasked value is kept so a
disclosed original can be checked against the log without the log ever holding it.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from ..policy.credentials import credential_reason
from ..policy.errors import pointer
from ..policy.jsonvalues import Path
from ..policy.pii import MAX_SCAN, Spans, scan_text
from .records import canonical

# ADL members the draft's privacy section keeps out of logs: personal contact data and the prompt.
ADL_PRIVATE_POINTERS = ("/provider/contact", "/system_prompt")
SECRET_MASK = "[masked:secret]"
# Literal secrets shorter than this are not searched for inside other strings (too many false hits).
MIN_LITERAL_SECRET = 6


class Masked(NamedTuple):
    value: Any
    pointers: tuple[str, ...]
    digest: str  # "sha256:<hex>" of the canonical unmasked value


class Masker:
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if len(s) >= MIN_LITERAL_SECRET}, key=len, reverse=True)

    def mask(self, value: Any, always: Iterable[str] = (), pii: Mapping[Path, Spans] | None = None) -> Masked:
        """Mask `value`; members at the `always` pointers are masked whatever they hold. `pii`:
        scan_leaves(value), when the caller has scanned it already (the PII is then not searched
        for again)."""
        digest = "sha256:" + hashlib.sha256(canonical(value)).hexdigest()
        forced = _forced(value, always) if always else _NOTHING_FORCED
        if isinstance(value, str):  # a leaf itself: no member name, never forced
            text = self._mask_text("", value, None if pii is None else pii.get((), ()))
            return Masked(value, (), digest) if text is None else Masked(text, ("",), digest)
        replacements: dict[Path, str] = dict.fromkeys(forced, SECRET_MASK)
        mask_text = self._mask_text
        # One walk over the containers; a string leaf is looked at where it is found, with the object
        # member it belongs to (an array item: its array's), and gets a path only if it is masked.
        # Iterative, as arguments may nest deeply; written out rather than built on
        # jsonvalues.iter_strings because every tool call on the Check path comes through here.
        stack: list[tuple[Any, Path, str]] = [(value, (), "")] if isinstance(value, (dict, list)) else []
        while stack:
            item, path, member = stack.pop()
            is_object = isinstance(item, dict)
            for key, child in item.items() if is_object else enumerate(item):
                if forced and (*path, key) in forced:
                    continue
                name = key if is_object and isinstance(key, str) else member
                if isinstance(child, str):
                    if not child:
                        continue
                    spans = None if pii is None else pii.get((*path, key), ())
                    if (text := mask_text(name, child, spans)) is not None:
                        replacements[(*path, key)] = text
                elif isinstance(child, (dict, list)):
                    stack.append((child, (*path, key), name))
        if not replacements:
            return Masked(value, (), digest)
        out = copy.deepcopy(value)
        for path, text in replacements.items():
            _set(out, path, text)
        return Masked(out, tuple(sorted(pointer(*p) for p in replacements)), digest)

    def _mask_text(self, member: str, text: str, spans: Spans | None = None) -> str | None:
        """The masked form of one string leaf, or None to keep it. `spans`: its PII matches when
        already known (None: search for them)."""
        if not text:
            return None
        if len(text) > MAX_SCAN:
            return f"[masked:unscanned:{len(text)} characters]"
        if (self._secrets and any(secret in text for secret in self._secrets)) or credential_reason(member, text):
            return SECRET_MASK
        if spans is None:
            spans = scan_text(text)
        if not spans:
            return None
        parts, last = [], 0
        for kind, start, end in sorted(spans, key=lambda s: s[1]):
            parts += [text[last:start], f"[masked:{kind}]"]
            last = end
        parts.append(text[last:])
        return "".join(parts)


_NOTHING_FORCED: frozenset[Path] = frozenset()


def _forced(value: Any, always: Iterable[str]) -> set[Path]:
    """The paths of the members at the `always` pointers that exist in `value`; a member inside
    another one goes with it."""
    forced = {found for ptr in always if (found := _resolve(value, ptr)) is not None}
    if len(forced) > 1:
        forced = {p for p in forced if not any(p[:n] in forced for n in range(1, len(p)))}
    return forced


def _resolve(value: Any, ptr: str) -> Path | None:
    """The path of an existing member named by a JSON Pointer, or None."""
    path: list[str | int] = []
    for raw in ptr.split("/")[1:] if ptr else []:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(value, dict) and token in value:
            value = value[token]
            path.append(token)
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            value = value[int(token)]
            path.append(int(token))
        else:
            return None
    return tuple(path) if path else None


def _set(target: Any, path: Path, text: str) -> None:
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = text
