"""The ADL and AAIF JSON Schemas, loaded by file (never by `$id`: two published files reuse one).

By default the package's own encoding of the ADL 0.1/0.2/0.3 core, the supported profiles and
the AAIF schemas is used (enforcer/data/schemas, shipped in the wheel). ADL_ENFORCER_SPEC_DIR
overrides it with a tree laid out either like that directory (adl/, aaif/) or like the published
specification repositories (agent-definition-language__specification/, Observalytics-SL__aaif/).
`spec_root()` chooses between the two (the command passes the spec_dir setting); everything else
is given a root.

A document is checked against its schemas with jsonschema_rs; the pure-Python validators in
schema_errors, which word each error, load only for a document that check refuses. The check is
built only for schemas whose every keyword and pattern means the same to both validators (see
`_portable`); any other schema set is always validated by the pure-Python validators.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Set
from functools import cache
from pathlib import Path
from typing import Any

from ..data import SCHEMAS
from ..quick_dataclass import dataclass
from .ecma import ecma_pattern
from .formats import is_uri, parse_timestamp
from .jsonvalues import MAX_SAFE_INTEGER

ADL_SPEC_REPO = "agent-definition-language__specification"
AAIF_REPO = "Observalytics-SL__aaif"
SUPPORTED_ADL = {"0.1": "0.1.0", "0.2": "0.2.0", "0.3": "0.3.0"}
# Profile identifiers this enforcer knows, mapped to their schema folder.
PROFILES = {
    "urn:adl:profile:governance:1.0": "governance/1.0",
    "urn:adl:profile:healthcare:1.0": "healthcare/1.0",
    "urn:adl:profile:financial:1.0": "financial/1.0",
    "urn:adl:profile:portfolio:1.0": "portfolio/1.0",
    "urn:adl:profile:registry:1.0": "registry/1.0",
}
# Profiles compose the core by one of these URIs (published tree, package encoding); each is
# pointed at the document's own core version.
_PROFILE_BASE_URIS = ("https://adl-spec.org/0.3/schema.json", "urn:adl-enforcer:schema:adl:core")
PACKAGED_SCHEMAS = SCHEMAS


class SpecMissing(RuntimeError):
    pass


def spec_root(spec_dir: Path | None = None) -> Path:
    """`spec_dir` (the spec_dir setting, ADL_ENFORCER_SPEC_DIR) when given (it must hold schemas),
    else the package's own schemas."""
    candidate = spec_dir or PACKAGED_SCHEMAS
    if _is_published(candidate) or (candidate / "adl").is_dir():
        return candidate
    where = f"ADL_ENFORCER_SPEC_DIR={spec_dir}" if spec_dir else f"the package data at {candidate} (a broken install?)"
    raise SpecMissing(
        f"ADL/AAIF schemas not found in {where}: the directory must hold adl/ and aaif/, or "
        f"{ADL_SPEC_REPO}/ and {AAIF_REPO}/"
    )


def _is_published(root: Path) -> bool:
    return (root / ADL_SPEC_REPO / "core").is_dir()


def _core_path(root: Path, version: str) -> Path:
    if _is_published(root):
        return root / ADL_SPEC_REPO / "core" / version / "schema.json"
    return root / "adl" / f"core-{version}.json"


def _profile_path(root: Path, identifier: str) -> Path:
    if _is_published(root):
        return root / ADL_SPEC_REPO / "profiles" / PROFILES[identifier] / "schema.json"
    return root / "adl" / f"profile-{PROFILES[identifier].replace('/', '-')}.json"


def _aaif_path(root: Path, schema_file: str) -> Path:
    if _is_published(root):
        return root / AAIF_REPO / "schema" / schema_file
    return root / "aaif" / schema_file


def _read(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def _read_schema(path: Path) -> dict[str, Any]:
    # Without `$schema` a `$ref` into this file keeps the extended validator class; with it, jsonschema
    # switches to the stock Draft 2020-12 class and drops the format and pattern semantics above.
    schema = _read(path)
    schema.pop("$schema", None)
    return schema


def supported_schema_version(adl_spec: object) -> str | None:
    """'0.2.7' -> '0.2.0' (same MAJOR.MINOR is supported); anything else -> None."""
    if not isinstance(adl_spec, str):
        return None
    parts = adl_spec.split(".")
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return SUPPORTED_ADL.get(f"{int(parts[0])}.{int(parts[1])}")


@dataclass(frozen=True)
class SchemaSet:
    root: Path

    def core(self, version: str) -> dict[str, Any]:
        return core_schema(self.root, version)

    def adl_validator(self, version: str, profiles: tuple[str, ...]) -> Any:
        """The pure-Python validator that words the errors (schema_errors.iter_leaf_errors)."""
        return _adl_validator(self.root, version, profiles)

    def aaif_validator(self, schema_file: str) -> Any:
        return _aaif_validator(self.root, schema_file)

    def adl_accepts(self, version: str, profiles: tuple[str, ...], document: dict[str, Any]) -> bool:
        """True when the document satisfies the core and these profiles' schemas. False: it does not,
        or the fast check cannot tell for these schemas; adl_validator then finds the errors."""
        return _accepts(_adl_check(self.root, version, profiles), document)

    def aaif_accepts(self, schema_file: str, document: dict[str, Any]) -> bool:
        """As adl_accepts, for an AAIF document and its schema (SpecMissing when it has none)."""
        return _accepts(_aaif_check(self.root, schema_file), document)

    def profile_members(self, profiles: tuple[str, ...]) -> frozenset[str]:
        """Top-level members the declared profiles add (not the core ones they also constrain)."""
        return _profile_members(self.root, profiles)


@cache
def profile_schema(root: Path, identifier: str) -> dict[str, Any]:
    return _read_schema(_profile_path(root, identifier))


@cache
def _profile_members(root: Path, profiles: tuple[str, ...]) -> frozenset[str]:
    names: set[str] = set()
    for identifier in profiles:
        names |= set(profile_schema(root, identifier).get("properties", {}))
    return frozenset(names - {"profiles", "data_classification"})


@cache
def core_schema(root: Path, version: str) -> dict[str, Any]:
    path = _core_path(root, version)
    if not path.is_file():
        raise SpecMissing(f"schema for ADL {version} not found at {path}")
    return _read_schema(path)


def profile_base_uris(core_uri: str) -> tuple[str, ...]:
    """The URIs by which profiles compose the core, other than the core's own: each names the
    document's own core, so a 0.1 or 0.2 document with profiles is checked against its version."""
    return tuple(uri for uri in _PROFILE_BASE_URIS if uri != core_uri)


def _composed(root: Path, version: str, profiles: tuple[str, ...]) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """The schema an ADL document must satisfy (the core and each profile, by reference) and the
    resources its references name."""
    core = core_schema(root, version)
    core_uri = core.get("$id", f"urn:adl-enforcer:core:{version}")
    resources: list[tuple[str, Any]] = [(uri, core) for uri in (core_uri, *profile_base_uris(core_uri))]
    composed: list[dict[str, Any]] = [{"$ref": core_uri}]
    for identifier in profiles:
        schema = profile_schema(root, identifier)
        uri = schema.get("$id", f"urn:adl-enforcer:profile:{PROFILES[identifier]}")
        resources.append((uri, schema))
        composed.append({"$ref": uri})
    # Unknown top-level members are found by `unknown_members`, not unevaluatedProperties: a
    # failing subschema drops its annotations and would make every member look unknown.
    return {"allOf": composed}, resources


@cache
def _adl_validator(root: Path, version: str, profiles: tuple[str, ...]) -> Any:
    from .schema_errors import adl_validator

    schema, resources = _composed(root, version, profiles)
    return adl_validator(schema, resources)


def unknown_members(schemas: SchemaSet, version: str, profiles: tuple[str, ...], document: dict[str, Any]) -> list[str]:
    """Top-level members defined neither by the core schema, a declared profile nor an extension rule."""
    known, extension_patterns = _core_members(schemas.root, version)
    known = known | schemas.profile_members(profiles)
    return [k for k in document if k not in known and not any(p.search(k) for p in extension_patterns)]


@cache
def _core_members(root: Path, version: str) -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    core = core_schema(root, version)
    return frozenset(core.get("properties", {})), tuple(ecma_pattern(p) for p in core.get("patternProperties", {}))


@cache
def _aaif_schema(root: Path, schema_file: str) -> dict[str, Any]:
    if "/" in schema_file or not schema_file.endswith(".schema.json"):
        raise SpecMissing(f"unknown AAIF schema {schema_file!r}")
    path = _aaif_path(root, schema_file)
    if not path.is_file():
        raise SpecMissing(f"AAIF schema {schema_file!r} not found at {path}")
    return _read_schema(path)


@cache
def _aaif_validator(root: Path, schema_file: str) -> Any:
    from .schema_errors import aaif_validator

    return aaif_validator(_aaif_schema(root, schema_file))


# ---- the fast check ----------------------------------------------------------------------------
#
# jsonschema_rs and the pure-Python validators (with schema_errors' ECMA-262 keywords) must accept
# the same documents, or a document the wording validator would refuse could pass. They are known
# to agree on the keywords below, on formats (only date-time and uri are asserted, by the same
# functions, and only for ADL), and on patterns written in _PORTABLE_PATTERN's subset: literals,
# classes, groups, alternation, quantifiers, anchors and \d, where both read `\d` as ASCII digits
# and `$` as the end of the input. `.`, `\s`, `\w`, `\b` and the like differ between the two (line
# terminators, Unicode whitespace) and so do keywords such as multipleOf: a schema using one is
# not given the fast check. So is one with a `$id` below its root (references inside it resolve
# differently), and a document holding a value the two read differently (see _read_alike).

_SUBSCHEMA = {"additionalProperties", "items", "contains", "not", "if", "then", "else", "propertyNames"}
_SUBSCHEMA_MAP = {"properties", "patternProperties", "$defs", "definitions"}
_SUBSCHEMA_LIST = {"allOf", "anyOf", "oneOf"}
_VALUES = {
    "$id", "$ref", "$comment", "title", "description", "default", "examples", "deprecated",
    "type", "enum", "const", "required", "format", "pattern",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "minLength", "maxLength", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
}  # fmt: skip
# Keywords of some draft or vocabulary that the two may not read alike: a schema using one is not
# given the fast check. Any other unknown member is an annotation to both.
_OTHER_KEYWORDS = {
    "id", "dependencies", "dependentRequired", "dependentSchemas", "prefixItems", "additionalItems",
    "unevaluatedItems", "unevaluatedProperties", "minContains", "maxContains", "multipleOf", "divisibleBy",
    "contentEncoding", "contentMediaType", "contentSchema", "extends", "disallow", "optional", "requires",
}  # fmt: skip
_ESCAPE = r"\\[dDtnrf^$\\.*+?()\[\]{}|/-]"
_CLASS = rf"\[\^?(?:{_ESCAPE}|[^\\\[\]])+\]"
_ATOM = rf"(?:{_ESCAPE}|{_CLASS}|\(\?:|\((?!\?)|[)|^$]|[^\\.\[\]{{}}()|*+?^$])"
_QUANTIFIER = r"(?:[*+?]|\{\d+(?:,\d*)?\})\??"
_PORTABLE_PATTERN = re.compile(rf"(?:{_ATOM}(?:{_QUANTIFIER})?)*", re.ASCII)


def _portable_pattern(pattern: Any) -> bool:
    if not isinstance(pattern, str) or _PORTABLE_PATTERN.fullmatch(pattern) is None:
        return False
    try:
        ecma_pattern(pattern)  # the wording validator must be able to use it too
    except re.error:
        return False
    return True


def _portable(schema: Any, uris: Set[str]) -> bool:
    """Whether every keyword and pattern of `schema` (iteratively: schemas may be deep) is one the two
    validators agree on; `uris`: the names a reference may give a whole resource by."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, bool):
            continue
        if not isinstance(node, dict):
            return False
        for keyword, value in node.items():
            if keyword == "$id" and node is not schema:
                # Inside not, contains and if jsonschema resolves references against the enclosing
                # resource, jsonschema_rs against this $id: the same reference names two schemas.
                return False
            if keyword in _SUBSCHEMA:
                stack.append(value)
            elif keyword in _SUBSCHEMA_MAP:
                if not isinstance(value, dict):
                    return False
                if keyword == "patternProperties" and not all(_portable_pattern(p) for p in value):
                    return False
                stack.extend(value.values())
            elif keyword in _SUBSCHEMA_LIST:
                if not isinstance(value, list):
                    return False
                stack.extend(value)
            elif not _portable_value(keyword, value, uris):
                return False
    return True


# A reference names a whole resource (all of which are looked at) or an entry of $defs (looked at
# with the schema holding it); one pointing anywhere else could reach a part no walk looked at.
_PORTABLE_REF = re.compile(r"[^#]*#?|#/(?:\$defs|definitions)/[A-Za-z0-9_.-]+", re.ASCII)


def _portable_value(keyword: str, value: Any, uris: Set[str]) -> bool:
    if keyword == "pattern":
        return _portable_pattern(value)
    if keyword == "$ref":
        if not isinstance(value, str) or _PORTABLE_REF.fullmatch(value) is None:
            return False
        # A whole resource only by the very name it is registered under: jsonschema_rs normalises a
        # URI (case, port, dot segments, escapes) before looking it up, the wording validator does not.
        resource = value.removesuffix("#")
        return value.startswith("#/") or resource == "" or resource in uris
    return keyword in _VALUES or not (keyword in _OTHER_KEYWORDS or keyword.startswith("$"))


def _formats(schemas: list[Any], asserted: bool) -> dict[str, Any]:
    """Format checks for jsonschema_rs: ADL asserts date-time and uri with the functions the
    wording validator uses; every other format (and every format of AAIF) is an annotation."""
    names: set[str] = set()
    stack = list(schemas)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if isinstance(node.get("format"), str):
                names.add(node["format"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    checks: dict[str, Any] = {name: _annotation for name in names}
    if asserted:
        checks["date-time"] = _is_timestamp
        checks["uri"] = is_uri
    return checks


def _annotation(value: str) -> bool:
    return True


def _is_timestamp(value: str) -> bool:
    return parse_timestamp(value) is not None


def _check(schema: dict[str, Any], resources: list[tuple[str, Any]], asserted: bool) -> Any | None:
    import jsonschema_rs

    # The core is one resource under several URIs: look at each schema once.
    everything = list({id(each): each for each in (schema, *(contents for _, contents in resources))}.values())
    # A schema file may hold NaN or Infinity (Python's json reads them), which jsonschema_rs reads as null.
    uris = {uri for uri, _ in resources}
    uris |= {each["$id"] for each in everything if isinstance(each, dict) and isinstance(each.get("$id"), str)}
    if not all(_portable(each, uris) and _read_alike(each) for each in everything):
        return None
    try:
        return jsonschema_rs.Draft202012Validator(
            schema,
            registry=jsonschema_rs.Registry(resources) if resources else None,
            formats=_formats(everything, asserted),
            validate_formats=True,
            # The portable subset needs no backtracking: the linear-time engine has no limit to hit.
            pattern_options=jsonschema_rs.RegexOptions(),
            offline=True,
        )
    except (jsonschema_rs.ReferencingError, jsonschema_rs.ValidationError, ValueError):
        return None  # a schema jsonschema_rs cannot build: the wording validator decides alone


@cache
def _adl_check(root: Path, version: str, profiles: tuple[str, ...]) -> Any | None:
    schema, resources = _composed(root, version, profiles)
    return _check(schema, resources, asserted=True)


@cache
def _aaif_check(root: Path, schema_file: str) -> Any | None:
    return _check(_aaif_schema(root, schema_file), [], asserted=False)


def _accepts(check: Any | None, document: dict[str, Any]) -> bool:
    if check is None or not _read_alike(document):
        return False
    try:
        return bool(check.is_valid(document))
    except Exception:  # a value jsonschema_rs cannot take: the wording validator decides
        return False


def _read_alike(document: Any) -> bool:
    """Whether both validators read every value of `document` as the same JSON value (iteratively:
    documents may be deep). Not so for a tuple (an array to jsonschema_rs, no JSON type to
    jsonschema), NaN and the infinities (no number to jsonschema_rs, so bounds skip them), other
    Python types, and integers beyond ±(2^53-1) (compared as floats by one, exactly by the other).
    The loader refuses all but the large integers; a caller may hand over a document it built."""
    stack = [document]
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is dict:
            if not all(type(key) is str for key in value):
                return False
            stack.extend(value.values())
        elif kind is list:
            stack.extend(value)
        elif kind is float:
            if not math.isfinite(value):
                return False
        elif kind is int:
            if abs(value) > MAX_SAFE_INTEGER:
                return False
        elif kind not in (str, bool, type(None)):
            return False
    return True
