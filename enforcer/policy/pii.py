"""PII detection in tool-call arguments: emails, phone numbers, payment cards (Luhn), IBANs (mod 97),
US social security numbers, UK national insurance numbers. Pure and bounded: only string leaves
are scanned, each at most MAX_SCAN characters."""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ..quick_dataclass import dataclass
from .errors import pointer
from .jsonvalues import Path, iter_strings

MAX_SCAN = 65536
# A string's PII matches: (kind, start, end).
Spans = Sequence[tuple[str, int, int]]

# The patterns that begin at a boundary consume their first character before they look behind for
# it (`\d(?<!\d\d)` is `(?<!\d)\d`), so that the regex engine skips to candidate first characters
# instead of trying every position.
# tests/unit/test_scan_patterns.py holds each equal to its plain form.
_EMAIL = re.compile(r"[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,253}\.[A-Za-z]{2,24}")
_PHONE = re.compile(r"(?:\+(?<![\w+]\+)\d|\d(?<![\w+]\d))[\d\s().-]{7,18}\d(?!\w)")
_CARD = re.compile(r"\d(?<!\d\d)(?:[ -]?\d){12,18}(?!\d)")
_IBAN = re.compile(r"[A-Z](?<!\w[A-Z])[A-Z]\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b")
_SSN = re.compile(r"\d(?<!\d\d)(?<=(?!000|666|9\d\d)\d)\d\d-(?!00)\d{2}-(?!0000)\d{4}(?!\d)")
_NINO = re.compile(r"[A-CEGHJ-PR-TW-Z](?<!\w[A-Z])[A-CEGHJ-NPR-TW-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b")
# Every pattern above needs an "@" (email) or a digit (the rest); text with neither skips them all.
_ANY_PII_CHARACTER = re.compile(r"[@\d]")
# Phone numbers, cards and SSNs are digits and separators only, nine characters at the least, and
# their patterns start at any digit: in long text with many numbers they are searched for only in
# the runs that could hold one.
_NUMBER_RUN = re.compile(r"\d[\d\s().+-]{8,}")
# The same for text that is all ASCII, with \d and \s spelled out as the ASCII characters they match
# there: the engine then tests each character against a table instead of looking up its Unicode
# category.
_ASCII_DIGITS = "".join(c for c in map(chr, range(128)) if re.match(r"\d", c))
_ASCII_SPACES = "".join(c for c in map(chr, range(128)) if re.match(r"\s", c))
_ASCII_NUMBER_RUN = re.compile(f"[{_ASCII_DIGITS}][{re.escape(_ASCII_DIGITS + _ASCII_SPACES)}().+-]{{8,}}")
# IBANs and UK national insurance numbers start with two capital letters at the start of a word and
# a digit after them (the latter may put a space between): both are searched for from the first place
# that has these, and not at all in text without one.
_CAPITALS_THEN_DIGIT = re.compile(r"[A-Z](?<!\w[A-Z])[A-Z] ?\d")
# An email is letters, digits, "._%+-" and one "@": it lies within one run of those characters, and
# its pattern can start at nearly any character. Only the runs around an "@" are searched.
_EMAIL_RUN = re.compile(r"[A-Za-z0-9._%+@-]*")


def _run_end(text: str, at: int) -> int:
    """Where the run of e-mail characters from `at` ends (the pattern matches the empty run too)."""
    found = _EMAIL_RUN.match(text, at)
    return found.end() if found is not None else at


@dataclass(frozen=True)
class PiiFinding:
    kind: str
    pointer: str
    start: int
    end: int


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _iban_ok(text: str) -> bool:
    compact = text.replace(" ", "")
    rearranged = compact[4:] + compact[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return 15 <= len(compact) <= 34 and int(number) % 97 == 1


def number_runs(text: str) -> list[tuple[int, int]]:
    """The spans of _NUMBER_RUN's matches in `text`."""
    pattern = _ASCII_NUMBER_RUN if text.isascii() else _NUMBER_RUN
    return [m.span() for m in pattern.finditer(text)]


def in_number_runs(pattern: re.Pattern[str], text: str, runs: list[tuple[int, int]]) -> Iterator[re.Match[str]]:
    """pattern.finditer(text) for a pattern whose matches are digits and separators only: searched in
    each run of _NUMBER_RUN, from the character before it (a phone number's "+") to the one after it
    (what the pattern's closing lookahead reads). No match crosses a run's end, as the character
    after a run is no separator."""
    for start, end in runs:
        yield from pattern.finditer(text, max(start - 1, 0), end + 1)


def capitals_start(text: str) -> int | None:
    """Where an IBAN or a national insurance number could first start in `text`, or None: searching
    from there finds every match of _IBAN and _NINO."""
    found = _CAPITALS_THEN_DIGIT.search(text)
    return found.start() if found else None


def email_matches(text: str) -> Iterator[re.Match[str]]:
    """_EMAIL.finditer(text), searched only in the runs of _EMAIL_RUN's characters around each "@"."""
    at = text.find("@")
    if at < 0:
        return
    backwards = text[::-1]  # the run's start is found by matching leftwards from the "@"
    while at >= 0:
        start = at - (_run_end(backwards, len(text) - at) - (len(text) - at))
        end = _run_end(text, at)
        yield from _EMAIL.finditer(text, start, end)
        at = text.find("@", end)


def scan_text(text: str) -> list[tuple[str, int, int]]:
    """Every PII match in `text` (its first MAX_SCAN characters): (kind, start, end)."""
    text = text[:MAX_SCAN]
    if not _ANY_PII_CHARACTER.search(text):
        return []
    found: list[tuple[str, int, int]] = []
    # The spans taken so far, ordered: they never overlap, so their ends are ordered too and one
    # bisection answers free() (a scan over every span made a text dense with matches quadratic).
    starts: list[int] = []
    ends: list[int] = []

    def free(a: int, b: int) -> bool:
        at = bisect.bisect_left(starts, b)  # the spans before `at` start before b
        if at and ends[at - 1] > a:
            return False
        starts.insert(at, a)  # a free span is taken: callers test everything else first
        ends.insert(at, b)
        return True

    for m in email_matches(text):
        if free(*m.span()):
            found.append(("email", *m.span()))
    capitals = capitals_start(text)
    for m in _IBAN.finditer(text, capitals) if capitals is not None else ():
        if _iban_ok(m.group()) and free(*m.span()):
            found.append(("iban", *m.span()))
    runs = number_runs(text)
    for m in in_number_runs(_CARD, text, runs):
        digits = re.sub(r"\D", "", m.group())
        if 13 <= len(digits) <= 19 and _luhn(digits) and free(*m.span()):
            found.append(("payment_card", *m.span()))
    for m in in_number_runs(_SSN, text, runs):
        if free(*m.span()):
            found.append(("us_ssn", *m.span()))
    for m in _NINO.finditer(text, capitals) if capitals is not None else ():
        if free(*m.span()):
            found.append(("uk_nino", *m.span()))
    for m in in_number_runs(_PHONE, text, runs):
        digits = re.sub(r"\D", "", m.group())
        if 9 <= len(digits) <= 15 and free(*m.span()):
            found.append(("phone", *m.span()))
    return found


def scan_leaves(value: Any) -> dict[Path, Spans]:
    """The PII matches of every string leaf of a JSON value that has any, by the leaf's path. The daemon
    scans a tool call's arguments once and hands the result to decide() and to the record's masking."""
    found: dict[Path, Spans] = {}
    for path, text in iter_strings(value):
        spans = scan_text(text)
        if spans:
            found[path] = spans
    return found


def findings(scanned: Mapping[Path, Spans]) -> list[PiiFinding]:
    """scan_leaves' result as findings with JSON Pointers, ordered by pointer and start."""
    found: list[PiiFinding] = []
    for path, spans in scanned.items():
        ptr = pointer(*path)
        found.extend(PiiFinding(kind, ptr, a, b) for kind, a, b in spans)
    found.sort(key=lambda f: (f.pointer, f.start))
    return found
