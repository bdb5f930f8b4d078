"""Documents for tests: a minimal ADL document, compiling one at a fixed time, and walking JSON."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enforcer.policy import CompileOptions, SchemaSet, compile_policy

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "policies" / "examples"
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)

# The published schemas and fixtures: test inputs only (the package validates with its own schemas).
SHARED_SPEC = REPO.parent / "shared" / "spec"


def base_adl(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "adl_spec": "0.3.0",
        "name": "Test Agent",
        "description": "test",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
    }
    doc.update(copy.deepcopy(extra))
    return doc


def compile_doc(schemas: SchemaSet, adl: dict[str, Any], aaif: dict[str, Any] | None = None, **options: Any) -> Any:
    return compile_policy(adl, aaif, schemas, NOW, CompileOptions(**options))


def json_paths(value: Any, leaves_only: bool = False, path: tuple = ()) -> Iterator[tuple]:
    """Every path into a JSON value (or only the paths of its scalar leaves), root excluded."""
    container = isinstance(value, dict | list)
    if path and not (leaves_only and container):
        yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in items:
        yield from json_paths(child, leaves_only, (*path, key))


def get_at(doc: Any, path: tuple) -> Any:
    for part in path:
        doc = doc[part]
    return doc


def set_at(doc: Any, path: tuple, value: Any) -> None:
    get_at(doc, path[:-1])[path[-1]] = value
