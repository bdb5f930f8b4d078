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


def member_name(path: Path) -> str:
    """The object member a leaf belongs to (for an array item: the array's member)."""
    return next((p for p in reversed(path) if isinstance(p, str)), "")
