"""Parse ADL/AAIF documents from bytes with hard limits checked before any other work.

Pure: takes bytes, returns data and findings. Limits follow the ADL draft's security
considerations (1 MB, depth 32, 1000 tools/resources/prompts, 500 patterns per domain).
"""

from __future__ import annotations

import io
import json
from functools import cache
from typing import TYPE_CHECKING, Any, Literal

from ..quick_dataclass import dataclass
from .errors import Finding, pointer

if TYPE_CHECKING:  # ruamel is slow to import: JSON documents never load it
    from ruamel.yaml import YAML

MAX_DOCUMENT_BYTES = 1_000_000
MAX_DEPTH = 32
MAX_ENTRIES = 1000
MAX_PATTERNS_PER_DOMAIN = 500
# YAML aliases can make a 1 MB file expand to an exponential tree; count visited nodes instead.
MAX_NODES = 250_000

DocumentKind = Literal["adl", "aaif"]


@dataclass(frozen=True)
class Parsed:
    document: Any
    kind: DocumentKind | None
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)


@cache
def _string_timestamp_constructor() -> type:
    from ruamel.yaml.constructor import SafeConstructor

    class StringTimestampConstructor(SafeConstructor):
        """YAML 1.2 core schema has no timestamp type: unquoted dates must stay strings."""

    StringTimestampConstructor.add_constructor("tag:yaml.org,2002:timestamp", SafeConstructor.construct_yaml_str)
    return StringTimestampConstructor


def _yaml_loader() -> YAML:
    from ruamel.yaml import YAML

    yaml = YAML(typ="safe", pure=True)
    yaml.version = (1, 2)
    yaml.Constructor = _string_timestamp_constructor()
    yaml.allow_duplicate_keys = False
    return yaml


class _YAMLInvalid(ValueError):
    pass


def _load_yaml(text: str) -> Any:
    from ruamel.yaml.error import YAMLError

    try:
        return _yaml_loader().load(io.StringIO(text))
    except YAMLError as exc:
        raise _YAMLInvalid(str(exc)) from exc


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # Two parsers that disagree on which duplicate wins is a classic signature bypass.
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"duplicate member {key!r}")
        out[key] = value
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _looks_like_yaml(filename: str | None, text: str) -> bool:
    if filename:
        lower = filename.lower()
        if lower.endswith((".yaml", ".yml")):
            return True
        if lower.endswith(".json"):
            return False
    return not text.lstrip().startswith(("{", "["))


def parse_document(data: bytes, filename: str | None = None) -> Parsed:
    """Parse JSON or YAML bytes into a document, enforcing size, depth and count limits."""
    if len(data) > MAX_DOCUMENT_BYTES:
        return _fail("ENF-1001", f"document is {len(data)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _fail("ADL-1001", f"document is not UTF-8: {exc.reason} at byte {exc.start}")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        if _looks_like_yaml(filename, text):
            document = _load_yaml(text)
        else:
            document = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)
    except RecursionError:
        return _fail("ENF-1002", f"document is nested deeper than {MAX_DEPTH} levels")
    except json.JSONDecodeError as exc:
        return _fail("ADL-1001", f"{exc.msg} at line {exc.lineno}, column {exc.colno}")
    except (_YAMLInvalid, _DuplicateKey, ValueError) as exc:
        return _fail("ADL-1001", " ".join(str(exc).split())[:500])
    if not isinstance(document, dict):
        return _fail("ADL-1002", f"top-level value is {_json_type(document)}, not an object")
    limit = _check_shape(document)
    if limit:
        return Parsed(None, None, (limit,))
    return Parsed(document, detect_kind(document), ())


def detect_kind(document: dict[str, Any]) -> DocumentKind | None:
    if "adl_spec" in document:
        return "adl"
    if document.get("sc_standard") == "SC-006" or "x-sc-schema" in document:
        return "aaif"
    return None


def _fail(code: str, detail: str) -> Parsed:
    return Parsed(None, None, (Finding(code, detail, ""),))


def _json_type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}.get(
        type(value), "null" if value is None else "a number"
    )


def _check_shape(document: dict[str, Any]) -> Finding | None:
    """Depth, node budget, non-string keys and non-JSON scalars, iteratively (no recursion)."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(document, 1, ())]
    nodes = 0
    while stack:
        value, depth, path = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return Finding("ENF-1001", f"document expands to more than {MAX_NODES} values")
        if isinstance(value, dict):
            if depth > MAX_DEPTH:
                return Finding("ENF-1002", f"nesting deeper than {MAX_DEPTH} levels", pointer(*path))
            for key, child in value.items():
                if not isinstance(key, str):
                    return Finding("ADL-1001", f"member name {key!r} is not a string", pointer(*path))
                stack.append((child, depth + 1, (*path, key)))
        elif isinstance(value, list):
            if depth > MAX_DEPTH:
                return Finding("ENF-1002", f"nesting deeper than {MAX_DEPTH} levels", pointer(*path))
            stack.extend((child, depth + 1, (*path, i)) for i, child in enumerate(value))
        elif isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            return Finding("ADL-1001", "NaN and Infinity are not JSON numbers", pointer(*path))
        elif not isinstance(value, str | int | float | bool | type(None)):
            return Finding("ADL-1001", f"value of type {type(value).__name__} is not JSON", pointer(*path))
    return _check_counts(document)


_ENTRY_ARRAYS = ("tools", "resources", "prompts")
_PATTERN_DOMAINS: dict[str, tuple[str, ...]] = {
    "network": ("allowed_hosts",),
    "filesystem": ("allowed_paths", "denied_paths"),
    "environment": ("allowed_variables", "denied_variables"),
    "execution": ("allowed_commands", "denied_commands"),
    "delegation": ("match", "deny"),
}


def _check_counts(document: dict[str, Any]) -> Finding | None:
    containers: list[tuple[dict[str, Any], tuple[str, ...]]] = [(document, ())]
    agent = document.get("agent")
    if isinstance(agent, dict):
        containers.append((agent, ("agent",)))
    for container, base in containers:
        for name in _ENTRY_ARRAYS:
            entries = container.get(name)
            if isinstance(entries, list) and len(entries) > MAX_ENTRIES:
                return Finding("ENF-1003", f"{len(entries)} {name}; the limit is {MAX_ENTRIES}", pointer(*base, name))
    permissions = document.get("permissions")
    if isinstance(permissions, dict):
        for domain, members in _PATTERN_DOMAINS.items():
            section = permissions.get(domain)
            if not isinstance(section, dict):
                continue
            total = sum(len(v) for m in members if isinstance(v := section.get(m), list))
            if total > MAX_PATTERNS_PER_DOMAIN:
                return Finding(
                    "ENF-1003",
                    f"{total} patterns in permissions.{domain}; the limit is {MAX_PATTERNS_PER_DOMAIN}",
                    pointer("permissions", domain),
                )
    return None
