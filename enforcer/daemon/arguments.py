"""Tool-call arguments as a Check receives them: parsed, bounded and free of duplicate keys.

Every limit is checked before anything is decided, so that what a request costs to decide, mask
and record is bounded by the limits (not by the caller), and a request beyond them fails alone
with INVALID_ARGUMENT naming the limit. Nesting is also what keeps the record serialisable: the
audit record wraps the arguments a few levels deep, and its encoder refuses deeper values.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

# The audit record's encoder stops at 254 levels and the record adds a few of its own.
DEPTH_CEILING = 200


@dataclass(frozen=True)
class ArgumentLimits:
    max_depth: int = 32  # nested objects and arrays
    max_items: int = 10_000  # object members and array elements, in total
    max_string: int = 262_144  # characters in one string (member names included)


class ArgumentError(ValueError):
    """Arguments that are not JSON or break a limit: the message says which."""


# Every member name ends in a quote followed by optional whitespace and a colon. Strings may hold
# that sequence too, so the count is at least the number of member names in the text.
_NAME_END = re.compile(rb'"[ \t\n\r]*:')


def parse_arguments(raw: str | bytes, limits: ArgumentLimits, spent: int = 0) -> tuple[Any, int]:
    """The arguments' value, and `spent` plus its items (members and elements): requests decided
    together (a CheckBatch) share one max_items. Raises ArgumentError."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith("depth limit exceeded"):  # orjson's own ceiling, far above any max_depth
            raise ArgumentError(_too_deep(limits)) from None
        raise ArgumentError(f"tool.arguments_json is not JSON: {exc}") from None
    members, items = _check_limits(value, limits, spent)
    if members:
        data = raw.encode() if isinstance(raw, str) else raw
        if len(_NAME_END.findall(data)) > members:  # more candidate names than members: look closely
            _reject_duplicates(data)
    return value, items


def _check_limits(value: Any, limits: ArgumentLimits, items: int) -> tuple[int, int]:
    """Walk the value without recursion; return the number of object members and the items."""
    max_depth, max_items, max_string = limits.max_depth, limits.max_items, limits.max_string
    members = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is str:
            if len(node) > max_string:
                raise ArgumentError(f"tool.arguments_json: a string is longer than max_argument_string ({max_string})")
            continue
        if kind is not dict and kind is not list:
            continue
        if depth > max_depth:
            raise ArgumentError(_too_deep(limits))
        items += len(node)
        if items > max_items:
            raise ArgumentError(
                f"tool.arguments_json: more than max_argument_items ({max_items}) members and elements"
                " in the request (a batch's requests count together)"
            )
        if kind is dict:
            members += len(node)
            for key in node:
                if len(key) > max_string:
                    raise ArgumentError(
                        f"tool.arguments_json: a member name is longer than max_argument_string ({max_string})"
                    )
            stack.extend((child, depth + 1) for child in node.values())
        else:
            stack.extend((child, depth + 1) for child in node)
    return members, items


def _too_deep(limits: ArgumentLimits) -> str:
    return f"tool.arguments_json: nesting deeper than max_argument_depth ({limits.max_depth})"


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        name = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ArgumentError(f"tool.arguments_json: duplicate member name {name[:64]!r}")
    return result


def _reject_duplicates(data: bytes) -> None:
    """A second parse that sees every object's members in order. The limits above bound its depth."""
    try:
        json.loads(data, object_pairs_hook=_unique)
    except ArgumentError:
        raise
    except ValueError as exc:  # text orjson took and the standard parser does not: refused all the same
        raise ArgumentError(f"tool.arguments_json is not JSON: {exc}") from None
