"""Small helpers for untrusted JSON values: type-guarded access and one walk over string leaves."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

Path = tuple[str | int, ...]


def obj(value: Any) -> dict[str, Any]:
    """`value` if it is an object, else an empty one: rules read wrongly typed members safely."""
    return value if isinstance(value, dict) else {}


def arr(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def iter_strings(value: Any, base: Path = ()) -> Iterator[tuple[Path, str]]:
    """Every string leaf with its path, iteratively (documents may be deep)."""
    stack: list[tuple[Any, Path]] = [(value, base)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, dict):
            stack.extend((v, (*path, k)) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(item))
        elif isinstance(item, str):
            yield path, item


# Larger integers are valid JSON but not I-JSON (RFC 7493): JCS (RFC 8785) cannot sign them.
MAX_SAFE_INTEGER = 2**53 - 1


def unsafe_integers(document: Any) -> list[Path]:
    """Paths of the integers outside ±(2^53-1), iteratively (documents may be deep)."""
    out: list[Path] = []
    stack: list[tuple[Any, Path]] = [(document, ())]
    while stack:
        value, path = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, (*path, k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, (*path, i)) for i, v in enumerate(value))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SAFE_INTEGER:
            out.append(path)
    return sorted(out, key=str)


def member_name(path: Path) -> str:
    """The object member a leaf belongs to (for an array item: the array's member)."""
    return next((p for p in reversed(path) if isinstance(p, str)), "")
