"""The PII and secret patterns are written so that the regex engine can skip to candidate first
characters (see enforcer/policy/pii.py). Here each is held equal, match for match, to its plain
form: the same pattern with its boundary test first, as a reader would write it."""

from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest

from enforcer.policy import credentials, pii

PLAIN_PII = {
    "_PHONE": r"(?<![\w+])\+?\d[\d\s().-]{7,18}\d(?!\w)",
    "_CARD": r"(?<!\d)(?:\d[ -]?){12,18}\d(?!\d)",
    "_IBAN": r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?\b",
    "_SSN": r"(?<!\d)(?!000|666|9\d\d)\d{3}-(?!00)\d{2}-(?!0000)\d{4}(?!\d)",
    "_NINO": r"\b(?![DFIQUV])[A-Z](?![DFIOQUV])[A-Z] ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b",
}
PLAIN_SECRETS = {
    "private key": r"-----BEGIN [A-Z ]*PRIVATE KEY-----",
    "AWS access key": r"\b(AKIA|ASIA)[0-9A-Z]{16}\b",
    "GitHub token": r"\bgh[pousr]_[A-Za-z0-9]{30,}\b",
    "Slack token": r"\bxox[abprs]-[A-Za-z0-9-]{10,}",
    "API secret key": r"\bsk-(proj-|ant-)?[A-Za-z0-9_-]{20,}",
    "Google API key": r"\bAIza[0-9A-Za-z_-]{35}\b",
    "JSON Web Token": r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    "bearer credential": r"\b(Bearer|Basic)\s+[A-Za-z0-9+/=._-]{16,}",
}
PAIRS = [(name, re.compile(plain), getattr(pii, name)) for name, plain in PLAIN_PII.items()] + [
    (label, re.compile(PLAIN_SECRETS[label]), pattern) for label, pattern in credentials.secret_value_patterns()
]

# Texts are built from characters the patterns care about and pieces that come close to (or make)
# a match, so that every pattern matches in many of them and fails narrowly in many more.
CHARACTERS = "0123456789      --+().@_AKISBDFQUVOXYZaekgh/=.\né"
PIECES = [
    *("AKIA", "ASIA", "ghp_", "xoxb-", "sk-", "sk-proj-", "AIza", "eyJ", "Bearer ", "Basic "),
    *("-----BEGIN RSA PRIVATE KEY-----", "----BEGIN EC PRIVATE KEY-----", "000", "666", "900", "GB"),
    *("DE89", "QQ", "AB", "+44", "4111"),
    *("@acme.example", "x_", "9", "123-45-6789", "AB123456C", "AB 12 34 56 C", "+44 20 7946 0958"),
    *("4111 1111 1111 1111", "GB82 WEST 1234 5698 7654 32", "AKIAABCDEFGHIJKLMNOP", "ghp_" + "a" * 36),
    *("xoxb-1234567890", "sk-" + "a" * 24, "AIza" + "b" * 35, "eyJabcdefghij.eyJabcdefghij.abcdefghij"),
    "Bearer abcdefghijklmnopqrst",
]


def _texts(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.4:
                parts.append(rng.choice(PIECES))
            else:
                parts.append("".join(rng.choice(CHARACTERS) for _ in range(rng.randint(0, 5))))
        texts.append("".join(parts))
    return texts


TEXTS = _texts(20_000, seed=7)


@pytest.mark.parametrize(("name", "plain", "fast"), PAIRS, ids=[name for name, _, _ in PAIRS])
def test_each_pattern_matches_exactly_where_its_plain_form_does(name: str, plain: re.Pattern, fast: re.Pattern) -> None:
    matched = 0
    for text in TEXTS:
        expected = [m.span() for m in plain.finditer(text)]
        assert [m.span() for m in fast.finditer(text)] == expected, (name, text)
        matched += bool(expected)
    assert matched > 100, f"{name} matched only {matched} texts: the texts no longer exercise it"


def test_the_combined_secret_search_finds_a_secret_exactly_when_one_pattern_does() -> None:
    for text in TEXTS:
        assert bool(credentials._ANY_SECRET_VALUE.search(text)) == any(
            pattern.search(text) for _, pattern in credentials.secret_value_patterns()
        ), text


def test_scan_text_without_an_at_sign_finds_no_email_and_with_one_the_same_spans() -> None:
    assert pii.scan_text("call 0800 and write to nobody") == []
    assert pii.scan_text("write to ops@acme.example today") == [("email", 9, 25)]


def _crowded(tokens: list[str], count: int, seed: int, lengths: tuple[int, int]) -> list[str]:
    """`count` texts of `lengths` tokens each, drawn from `tokens`: the pieces a search cares about
    crowded together."""
    rng = random.Random(seed)
    return ["".join(rng.choice(tokens) for _ in range(rng.randint(*lengths))) for _ in range(count)]


def _long_numeric_texts(count: int, seed: int) -> list[str]:
    """Long texts where numbers, separators and the pieces above crowd together."""
    tokens = ["2024", "42", "0.5", "(1, 2)", "-1", "+", " ", "  ", "-", "x", "ab", "\n", *PIECES]
    return _crowded(tokens, count, seed, (20, 200))


@pytest.mark.parametrize("name", ["_CARD", "_SSN", "_PHONE"])
def test_searching_only_the_number_runs_finds_every_match(name: str) -> None:
    pattern = getattr(pii, name)
    matched = 0
    for text in TEXTS + _long_numeric_texts(3_000, seed=11):
        expected = [m.span() for m in pattern.finditer(text)]
        assert [m.span() for m in pii.in_number_runs(pattern, text, pii.number_runs(text))] == expected, (name, text)
        matched += bool(expected)
    assert matched > 100


def test_the_number_runs_of_ascii_text_are_those_of_any_text() -> None:
    """number_runs() spells out \\d and \\s for ASCII text; other text (Unicode digits and spaces
    among it here) takes the plain pattern. Both give _NUMBER_RUN's matches."""
    tokens = ["7", "12", " ", "(", ")", ".", "+", "-", "\t", "\x1c", "\x1f", "\x0b", "a", "_"]
    unicode = ["\u0663", "\uff13", "\u00a0", "\u2003", "\u3000", "\x85", "\u2028"]
    ascii_texts = _crowded(tokens, 4_000, seed=19, lengths=(5, 60))
    mixed = _crowded(tokens + unicode, 4_000, seed=23, lengths=(5, 60))
    runs_found = 0
    for text in TEXTS + ascii_texts + mixed:
        expected = [m.span() for m in pii._NUMBER_RUN.finditer(text)]
        assert pii.number_runs(text) == expected, repr(text)
        runs_found += bool(expected) and text.isascii()
    assert runs_found > 500


def test_searching_only_the_runs_around_an_at_sign_finds_every_email() -> None:
    tokens = ["@", "@@", "a", "ops", ".", "-", "_", "%", "+", " ", "\n", "acme.example", "x.co", "é", "(", *PIECES]
    crowded = _crowded(tokens, 5_000, seed=13, lengths=(5, 120))
    matched = 0
    for text in TEXTS + crowded:
        expected = [m.span() for m in pii._EMAIL.finditer(text)]
        assert [m.span() for m in pii.email_matches(text)] == expected, text
        matched += bool(expected)
    assert matched > 100


@pytest.mark.parametrize("name", ["_IBAN", "_NINO"])
def test_searching_from_the_first_capitals_finds_every_match(name: str) -> None:
    pattern = getattr(pii, name)
    tokens = ["GB", "AB", "QQ", "DE", "Z", "x", "_", " ", "  ", "8", "12", "82", "WEST", "1234", "\n", *PIECES]
    crowded = _crowded(tokens, 5_000, seed=17, lengths=(5, 80))
    matched = 0
    for text in TEXTS + crowded:
        start = pii.capitals_start(text)
        expected = [m.span() for m in pattern.finditer(text)]
        found = [m.span() for m in pattern.finditer(text, start)] if start is not None else []
        assert found == expected, text
        matched += bool(expected)
    assert matched > 100


def test_each_secret_pattern_is_compiled_only_to_name_a_secret_found() -> None:
    """Every launch masks its argv: a value without a secret costs the combined search only."""
    code = (
        "from enforcer.policy import credentials as c\n"
        "print(c.credential_reason('argv', '/bin/true'), c.secret_value_patterns.cache_info().currsize)\n"
        "print(c.credential_reason('argv', 'x AKIAABCDEFGHIJKLMNOP'), c.secret_value_patterns.cache_info().currsize)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines() == ["None 0", "value looks like a AWS access key 1"]
