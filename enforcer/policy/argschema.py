"""A tool's argument schema and its validator, built when first needed.

A compiled policy read back from the policy cache carries the schemas only: launching a command
never checks tool arguments, so the validator library loads on the first tool call that does.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def build_validator(schema: dict[str, Any] | bool) -> Any:
    """A tool-argument validator. offline: a document's `$ref` never makes the enforcer fetch a URL."""
    import jsonschema_rs

    return jsonschema_rs.validator_for(schema, offline=True)


class ArgumentSchema:
    """The schema and, once built, its jsonschema_rs validator (is_valid / iter_errors)."""

    __slots__ = ("_validator", "schema")

    def __init__(self, schema: dict[str, Any] | bool, validator: Any = None) -> None:
        self.schema = schema
        self._validator = validator

    def _built(self) -> Any:
        # Two threads may both build it: the results are equal and either may be kept.
        if self._validator is None:
            self._validator = build_validator(self.schema)
        return self._validator

    def is_valid(self, instance: Any) -> bool:
        return bool(self._built().is_valid(instance))

    def iter_errors(self, instance: Any) -> Iterator[Any]:
        return iter(self._built().iter_errors(instance))

    def __reduce__(self) -> tuple[Any, ...]:
        return (ArgumentSchema, (self.schema,))

    def __repr__(self) -> str:
        return f"ArgumentSchema({self.schema!r})"
