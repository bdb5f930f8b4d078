"""ADL §4.4 patterns: literal, `*` within one segment, `**` across path segments.

Four flavours: host (segments split on '.', case-insensitive, IDNA-normalised), path (segments
split on '/'), env and command (`*` matches any characters). Patterns are never regular
expressions: each is parsed into segments once and matched by the small automata below.
pathspec's gitwildmatch was considered and rejected: its `**` and trailing-slash rules differ
from §4.4 (`/data/**` must match `/data/` itself), and it has no host flavour.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import field
from typing import Generic, Literal, TypeVar

from ..quick_dataclass import dataclass

Flavour = Literal["host", "path", "env", "command"]
T = TypeVar("T")

# Printable ASCII except '*' may appear literally (Appendix D literal-char); env and command
# names are further restricted to what a kernel or shell would accept.
_LITERAL_OK = re.compile(r"^[\x21-\x7e]*$")
_HOST_LABEL_OK = re.compile(r"^[a-z0-9_*-]+$")
_ENV_OK = re.compile(r"^[A-Za-z0-9_*.-]+$")


class PatternError(ValueError):
    """A pattern that violates §4.4; `reason` is human text."""


def validate(pattern: object, flavour: Flavour) -> str | None:
    """Return why `pattern` is invalid for `flavour`, or None when it is valid."""
    if not isinstance(pattern, str):
        return "pattern is not a string"
    if pattern == "":
        return "empty pattern"
    if "***" in pattern:
        return "'***' is not a wildcard"
    if not _LITERAL_OK.match(pattern):
        return "pattern contains whitespace, control or non-ASCII characters"
    if flavour != "path" and "**" in pattern:
        return f"'**' is only valid in filesystem path patterns, not in {flavour} patterns"
    if flavour == "host":
        return _validate_host(pattern)
    if flavour == "path":
        return _validate_path(pattern)
    if flavour == "env" and not _ENV_OK.match(pattern):
        return "variable patterns may contain only letters, digits, '_', '.', '-' and '*'"
    return None


def _validate_host(pattern: str) -> str | None:
    body = pattern[:-1] if pattern.endswith(".") else pattern
    if pattern == "*":
        return None
    if ":" in body or "/" in body:
        return "host patterns name a host only (no scheme, port or path)"
    if body.startswith(".") and body.strip("."):
        return f"a leading '.' is not a wildcard: for a domain and its subdomains write '{body[1:]}' and '*{body}'"
    labels = body.lower().split(".")
    if any(label == "" for label in labels):
        return "empty label in host pattern"
    for label in labels:
        if not _HOST_LABEL_OK.match(label):
            return f"label {label!r} is not a valid host label"
        if len(label) > 63:
            return f"label {label!r} is longer than 63 characters"
    return None


def _validate_path(pattern: str) -> str | None:
    if not pattern.startswith("/"):
        return "path patterns must be absolute (start with '/')"
    for segment in pattern.split("/"):
        if "**" in segment and segment != "**":
            return "'**' must be a whole path segment"
        if segment in (".", ".."):
            return "'.' and '..' segments are not allowed in path patterns"
    return None


def is_bare_wildcard(pattern: str) -> bool:
    return pattern in ("*", "**", "/**")


def normalize_host(host: str) -> str:
    """Lower-case, strip one trailing dot, convert Unicode labels to A-labels (UTS 46)."""
    host = host.strip()
    if host.endswith("."):
        host = host[:-1]
    if not host:
        raise PatternError("empty host name")
    if host.isascii():
        return host.lower()
    import idna  # only for Unicode names: launching a command never needs its tables

    try:
        return idna.encode(host, uts46=True).decode("ascii")
    except idna.IDNAError as exc:
        raise PatternError(f"host {host!r} is not a valid IDNA name: {exc}") from exc


class _Glob:
    """A segment with '*' (a single segment: no '.' for hosts, no '/' for paths) as its literal
    parts. A value matches when it starts with the first part, ends with the last, and holds the
    middle ones in order between them: taking each middle part at its first place from the left
    is never worse than a later one, so one pass of str.find decides, in time linear in the value
    for each part. A backtracking regular expression would take time exponential in the number of
    '*': a policy's pattern and an agent's 255-character name could stall a decision for hours."""

    __slots__ = ("middle", "prefix", "size", "suffix")

    def __init__(self, segment: str) -> None:
        parts = segment.split("*")
        self.prefix, self.suffix = parts[0], parts[-1]
        self.middle = tuple(part for part in parts[1:-1] if part)
        self.size = len(segment) - segment.count("*")  # the least a matching value holds

    def match(self, value: str) -> bool:
        if len(value) < self.size or not value.startswith(self.prefix) or not value.endswith(self.suffix):
            return False
        at, end = len(self.prefix), len(value) - len(self.suffix)
        for part in self.middle:
            found = value.find(part, at, end)
            if found < 0:
                return False
            at = found + len(part)
        return True


class _WildIndex(Generic[T]):
    """Wildcard segments (or names) indexed by their literal prefix and suffix.

    A segment `pre*mid*suf` can only match a value that starts with `pre` and ends with `suf`, so a
    lookup probes the value's own prefixes and suffixes of the lengths present here: its cost is
    bounded by the value's length, not by how many wildcard patterns share this position. Only
    candidates with a middle part are confirmed by their matcher (_Glob).
    """

    __slots__ = ("_by_prefix", "_prefix_lengths", "_values")

    def __init__(self) -> None:
        self._values: dict[str, T] = {}
        # prefix -> (suffix -> [(matcher or None, value)], suffix lengths in that group)
        self._by_prefix: dict[str, tuple[dict[str, list[tuple[_Glob | None, T]]], list[int]]] = {}
        self._prefix_lengths: list[int] = []

    def __bool__(self) -> bool:
        return bool(self._values)

    def get(self, segment: str) -> T | None:
        return self._values.get(segment)

    def add(self, segment: str, value: T) -> None:
        """Register `segment` (which contains '*' and is not registered yet) with `value`."""
        self._values[segment] = value
        parts = segment.split("*")
        prefix, suffix = parts[0], parts[-1]
        # One '*': any value long enough to hold prefix and suffix apart matches.
        matcher = _Glob(segment) if len(parts) > 2 else None
        group = self._by_prefix.get(prefix)
        if group is None:
            group = self._by_prefix[prefix] = ({}, [])
            if len(prefix) not in self._prefix_lengths:
                self._prefix_lengths.append(len(prefix))
                self._prefix_lengths.sort()
        by_suffix, suffix_lengths = group
        if suffix not in by_suffix:
            by_suffix[suffix] = []
            if len(suffix) not in suffix_lengths:
                suffix_lengths.append(len(suffix))
                suffix_lengths.sort()
        by_suffix[suffix].append((matcher, value))

    def match(self, value: str) -> Iterator[T]:
        size = len(value)
        for lp in self._prefix_lengths:
            if lp > size:
                break
            group = self._by_prefix.get(value[:lp])
            if group is None:
                continue
            by_suffix, suffix_lengths = group
            for ls in suffix_lengths:
                if lp + ls > size:
                    break
                for matcher, found in by_suffix.get(value[size - ls :], ()):
                    if matcher is None or matcher.match(value):
                        yield found


@dataclass
class _Node:
    literal: dict[str, _Node] = field(default_factory=dict)
    wild: _WildIndex[_Node] = field(default_factory=_WildIndex)
    globstar: _Node | None = None
    terminal: list[int] = field(default_factory=list)


class SegmentTrie:
    """Patterns as a trie of segments; lookup cost grows with the name, not the pattern count.

    Host names are stored reversed (TLD first) so patterns sharing a suffix share nodes; wildcard
    segments at one node are indexed by their literal ends (_WildIndex).
    """

    def __init__(self, flavour: Literal["host", "path"]) -> None:
        self.flavour = flavour
        self.root = _Node()

    def _split(self, value: str) -> list[str]:
        if self.flavour == "host":
            return list(reversed(value.split(".")))
        # '/data/' and '/data' are the same directory; empty segments carry no meaning.
        return [s for s in value.split("/") if s]

    def add(self, pattern: str, index: int) -> None:
        node = self.root
        if self.flavour == "host":
            pattern = pattern.lower().rstrip(".") if pattern != "*" else pattern
        for segment in self._split(pattern):
            if self.flavour == "path" and segment == "**":
                if node.globstar is None:
                    node.globstar = _Node()
                node = node.globstar
            elif "*" in segment:
                child = node.wild.get(segment)
                if child is None:
                    child = _Node()
                    node.wild.add(segment, child)
                node = child
            else:
                node = node.literal.setdefault(segment, _Node())
        node.terminal.append(index)

    def match(self, value: str, *, or_ancestor: bool = False) -> list[int]:
        """Indexes of every pattern matching `value` (already normalised); with `or_ancestor`, also
        of those matching a leading part of it (for paths: a directory that contains it)."""
        segments = self._split(value)
        found: set[int] = set()
        # Each (node, position) state is expanded once, so consecutive '**' cannot blow up.
        seen: set[tuple[int, int]] = set()
        stack: list[tuple[_Node, int]] = [(self.root, 0)]
        while stack:
            node, i = stack.pop()
            state = (id(node), i)
            if state in seen:
                continue
            seen.add(state)
            if node.globstar is not None:
                # '**' consumes zero or more whole segments.
                stack.extend((node.globstar, j) for j in range(i, len(segments) + 1))
            if i == len(segments) or or_ancestor:
                found.update(node.terminal)
            if i == len(segments):
                continue
            segment = segments[i]
            child = node.literal.get(segment)
            if child is not None:
                stack.append((child, i + 1))
            if node.wild:
                stack.extend((wild_child, i + 1) for wild_child in node.wild.match(segment))
        return sorted(found)

    def continues(self, path: str, *, named: bool = False) -> bool:
        """Whether some pattern can still consume segments below `path` (a '**' just entered absorbs
        any number of them); with `named`, only when the last segment was matched by a pattern
        segment of its own, not absorbed by a '**'. The creation guard asks it of moved trees."""
        segments = self._split(path)
        seen: set[tuple[int, int, bool]] = set()
        stack = [(self.root, 0, False)]
        while stack:
            node, i, after_globstar = stack.pop()
            if (id(node), i, after_globstar) in seen:
                continue
            seen.add((id(node), i, after_globstar))
            if i == len(segments):
                if named and after_globstar:
                    continue
                if node.literal or node.wild or node.globstar is not None or (after_globstar and node.terminal):
                    return True
                continue
            if node.globstar is not None:
                stack.extend((node.globstar, j, True) for j in range(i, len(segments) + 1))
            child = node.literal.get(segments[i])
            if child is not None:
                stack.append((child, i + 1, False))
            if node.wild:
                stack.extend((wild, i + 1, False) for wild in node.wild.match(segments[i]))
        return False


class NameSet:
    """Env-variable or command-name patterns: `*` matches any characters, case-sensitive."""

    def __init__(self) -> None:
        self.literal: dict[str, list[int]] = {}
        self.wild: _WildIndex[list[int]] = _WildIndex()

    def add(self, pattern: str, index: int) -> None:
        if "*" in pattern:
            indexes = self.wild.get(pattern)
            if indexes is None:
                indexes = []
                self.wild.add(pattern, indexes)
            indexes.append(index)
        else:
            self.literal.setdefault(pattern, []).append(index)

    def match(self, value: str) -> list[int]:
        found = set(self.literal.get(value, ()))
        for indexes in self.wild.match(value):
            found.update(indexes)
        return sorted(found)


@dataclass(frozen=True)
class PatternList:
    """A compiled list of patterns of one flavour, remembering each source index."""

    flavour: Flavour
    patterns: tuple[str, ...]
    _index: SegmentTrie | NameSet
    _match_all: tuple[int, ...]  # bare '*' host patterns: they match names of any depth

    @classmethod
    def compile(cls, patterns: Iterable[str], flavour: Flavour) -> PatternList:
        pats = tuple(patterns)
        index: SegmentTrie | NameSet = SegmentTrie(flavour) if flavour in ("host", "path") else NameSet()
        match_all: list[int] = []
        for i, p in enumerate(pats):
            reason = validate(p, flavour)
            if reason:
                raise PatternError(f"{p!r}: {reason}")
            if flavour == "host" and p == "*":
                match_all.append(i)
            else:
                index.add(p, i)
        return cls(flavour, pats, index, tuple(match_all))

    def match(self, value: str) -> list[int]:
        """Source indexes of all patterns that match `value`, in ascending order."""
        found = self._index.match(value)
        return sorted({*found, *self._match_all}) if self._match_all else found

    def first(self, value: str) -> int | None:
        found = self.match(value)
        return found[0] if found else None

    def first_covering(self, path: str) -> int | None:
        """The first path pattern matching `path` or a directory above it."""
        if not isinstance(self._index, SegmentTrie) or self.flavour != "path":
            raise TypeError("first_covering is for path patterns")
        found = self._index.match(path, or_ancestor=True)
        return found[0] if found else None

    def __bool__(self) -> bool:
        return bool(self.patterns)
