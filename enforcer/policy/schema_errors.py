"""The pure-Python JSON Schema validators that word a document's schema errors.

Validating is specs' jsonschema_rs check; this module (jsonschema and referencing, slow to import)
loads only for a document that check refuses, or where it cannot be used, to find and word each
error with the same messages, paths and codes as always.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

from .ecma import ecma_pattern
from .formats import is_uri, parse_timestamp


def _check_format(validator: Any, fmt: str, instance: Any, schema: dict[str, Any]) -> Iterator[ValidationError]:
    # ADL makes timestamps (VAL-05) and URIs (VAL-06) semantic rules with their own codes;
    # other format annotations stay annotations.
    if not isinstance(instance, str):
        return
    if fmt == "date-time" and parse_timestamp(instance) is None:
        yield ValidationError(f"{instance!r} is not an ISO 8601 timestamp with timezone")
    elif fmt == "uri" and not is_uri(instance):
        yield ValidationError(f"{instance!r} is not a valid RFC 3986 URI")


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


def adl_validator(schema: dict[str, Any], resources: list[tuple[str, Any]]) -> Any:
    """The validator of an ADL document's composed schema (specs._composed), its references
    resolved only among `resources`."""
    registry: Registry = Registry().with_resources(
        (uri, Resource.from_contents(contents, default_specification=DRAFT202012)) for uri, contents in resources
    )
    return ADLSchemaValidator(schema, registry=registry)


def aaif_validator(schema: dict[str, Any]) -> Any:
    return AAIFSchemaValidator(schema)


def iter_leaf_errors(validator: Any, instance: Any) -> Iterator[ValidationError]:
    """Yield the most specific error of each failure (descending into oneOf/anyOf/allOf)."""
    for error in validator.iter_errors(instance):
        while error.context:
            error = best_match(error.context)
        yield error
