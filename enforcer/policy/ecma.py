"""JSON Schema patterns (ECMA-262 regular expressions) as Python regular expressions."""

from __future__ import annotations

import re
from functools import cache


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
