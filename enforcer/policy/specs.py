"""The ADL and AAIF JSON Schemas, loaded by file (never by `$id`: two published files reuse one).

By default the package's own encoding of the ADL 0.1/0.2/0.3 core, the supported profiles and
the AAIF schemas is used (enforcer/data/schemas, shipped in the wheel). ADL_ENFORCER_SPEC_DIR
overrides it with a tree laid out either like that directory (adl/, aaif/) or like the published
specification repositories (agent-definition-language__specification/, Observalytics-SL__aaif/).
`spec_root()` chooses between the two (the command passes the spec_dir setting); everything else
is given a root.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from ..data import SCHEMAS
from .formats import is_uri, parse_timestamp

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


def _check_format(validator: Any, fmt: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    # ADL makes timestamps (VAL-05) and URIs (VAL-06) semantic rules with their own codes;
    # other format annotations stay annotations.
    if not isinstance(instance, str):
        return
    if fmt == "date-time" and parse_timestamp(instance) is None:
        yield ValidationError(f"{instance!r} is not an ISO 8601 timestamp with timezone")
    elif fmt == "uri" and not is_uri(instance):
        yield ValidationError(f"{instance!r} is not a valid RFC 3986 URI")


@cache
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema (ECMA-262) pattern as a Python regex: `\\d` and `\\w` are ASCII classes and `$` ends
    the input (Python's `$` also matches before a final newline, so "read_file\\n" would pass
    `^[a-z_]+$`). re.ASCII also narrows `\\s` to ASCII whitespace, stricter than ECMA-262; no shipped
    schema uses it."""
    out: list[str] = []
    in_class = escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == "[":
            in_class = True
        elif char == "]":
            in_class = False
        elif char == "$" and not in_class:
            out.append(r"\Z")
            continue
        out.append(char)
    return re.compile("".join(out), re.ASCII)


def _check_pattern(validator: Any, pattern: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    if isinstance(instance, str) and not ecma_pattern(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _matches_any(patterns: Any, key: str) -> bool:
    return any(ecma_pattern(p).search(key) for p in patterns)


def _check_pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if ecma_pattern(pattern).search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _check_additional_properties(
    validator: Any, additional: Any, instance: Any, schema: dict[str, Any]
) -> Iterator[ValidationError]:
    # jsonschema's own keyword matches patternProperties with Python's `$`: "x_id\n" would pass as an
    # extension member.
    if not validator.is_type(instance, "object"):
        return
    known, patterns = schema.get("properties", {}), schema.get("patternProperties", {})
    extras = [key for key in instance if key not in known and not _matches_any(patterns, key)]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif additional is False and extras:
        names = ", ".join(repr(each) for each in sorted(extras))
        if patterns:
            verb = "does" if len(extras) == 1 else "do"
            regexes = ", ".join(repr(each) for each in sorted(patterns))
            yield ValidationError(f"{names} {verb} not match any of the regexes: {regexes}")
        else:
            verb = "was" if len(extras) == 1 else "were"
            yield ValidationError(f"Additional properties are not allowed ({names} {verb} unexpected)")


_ECMA_KEYWORDS = {
    "pattern": _check_pattern,
    "patternProperties": _check_pattern_properties,
    "additionalProperties": _check_additional_properties,
}
ADLSchemaValidator = validators.extend(Draft202012Validator, {"format": _check_format, **_ECMA_KEYWORDS})
# AAIF format annotations are not assertions (Draft 2020-12 default): only the pattern semantics change.
AAIFSchemaValidator = validators.extend(Draft202012Validator, _ECMA_KEYWORDS)


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
        return _core_schema(self.root, version)

    def adl_validator(self, version: str, profiles: tuple[str, ...]) -> Any:
        return _adl_validator(self.root, version, profiles)

    def aaif_validator(self, schema_file: str) -> Any:
        return _aaif_validator(self.root, schema_file)

    def profile_members(self, profiles: tuple[str, ...]) -> frozenset[str]:
        """Top-level members the declared profiles add (not the core ones they also constrain)."""
        return _profile_members(self.root, profiles)


@cache
def _profile_schema(root: Path, identifier: str) -> dict[str, Any]:
    return _read_schema(_profile_path(root, identifier))


@cache
def _profile_members(root: Path, profiles: tuple[str, ...]) -> frozenset[str]:
    names: set[str] = set()
    for identifier in profiles:
        names |= set(_profile_schema(root, identifier).get("properties", {}))
    return frozenset(names - {"profiles", "data_classification"})


@cache
def _core_schema(root: Path, version: str) -> dict[str, Any]:
    path = _core_path(root, version)
    if not path.is_file():
        raise SpecMissing(f"schema for ADL {version} not found at {path}")
    return _read_schema(path)


@cache
def _adl_validator(root: Path, version: str, profiles: tuple[str, ...]) -> Any:
    core = _core_schema(root, version)
    core_uri = core.get("$id", f"urn:adl-enforcer:core:{version}")
    resources = [(core_uri, Resource.from_contents(core, default_specification=DRAFT202012))]
    # Profile schemas compose the core by URI; point that URI at this document's own core
    # so a 0.1 or 0.2 document with profiles is checked against its own version.
    for base_uri in _PROFILE_BASE_URIS:
        if base_uri != core_uri:
            resources.append((base_uri, Resource.from_contents(core, default_specification=DRAFT202012)))
    composed: list[dict[str, Any]] = [{"$ref": core_uri}]
    for identifier in profiles:
        schema = _profile_schema(root, identifier)
        uri = schema.get("$id", f"urn:adl-enforcer:profile:{PROFILES[identifier]}")
        resources.append((uri, Resource.from_contents(schema, default_specification=DRAFT202012)))
        composed.append({"$ref": uri})
    registry: Registry = Registry().with_resources(resources)
    # Unknown top-level members are found by `unknown_members`, not unevaluatedProperties: a
    # failing subschema drops its annotations and would make every member look unknown.
    return ADLSchemaValidator({"allOf": composed}, registry=registry)


def unknown_members(schemas: SchemaSet, version: str, profiles: tuple[str, ...], document: dict[str, Any]) -> list[str]:
    """Top-level members defined neither by the core schema, a declared profile nor an extension rule."""
    known, extension_patterns = _core_members(schemas.root, version)
    known = known | schemas.profile_members(profiles)
    return [k for k in document if k not in known and not any(p.search(k) for p in extension_patterns)]


@cache
def _core_members(root: Path, version: str) -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    core = _core_schema(root, version)
    return frozenset(core.get("properties", {})), tuple(ecma_pattern(p) for p in core.get("patternProperties", {}))


@cache
def _aaif_validator(root: Path, schema_file: str) -> Any:
    if "/" in schema_file or not schema_file.endswith(".schema.json"):
        raise SpecMissing(f"unknown AAIF schema {schema_file!r}")
    path = _aaif_path(root, schema_file)
    if not path.is_file():
        raise SpecMissing(f"AAIF schema {schema_file!r} not found at {path}")
    return AAIFSchemaValidator(_read_schema(path))


def iter_leaf_errors(validator: Any, instance: Any) -> Iterator[ValidationError]:
    """Yield the most specific error of each failure (descending into oneOf/anyOf/allOf)."""
    for error in validator.iter_errors(instance):
        while error.context:
            error = best_match(error.context)
        yield error
