"""A policy document from an untrusted author (or an operator's careless one) holds a pattern with
many '*' in one segment; the agent, or an API caller, then asks about a name made to almost match
it: 255 characters for a file name, 63 for a host label. Matching must stay fast: the daemon decides
for every caller on few threads, and the egress filter and the creation guard are the session's
root helpers."""

from __future__ import annotations

import fnmatch
import time

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from enforcer.policy.patterns import PatternList

BOUND_S = 1.0  # for all cases together; the backtracking matcher took minutes for the path case alone


def test_many_stars_against_a_long_near_miss_decide_at_once() -> None:
    cases = [
        ("path", "/data/" + "*a" * 20 + "*b*", "/data/" + "a" * 255),
        ("path", "/data/**/" + "*a" * 20 + "*b", "/data/x/y/" + "a" * 255),
        ("host", "*a" * 30 + "*b.example.com", "a" * 63 + ".example.com"),
        ("env", "*A" * 30 + "*B*", "A" * 4096),
        ("command", "*a" * 30 + "*b*", "a" * 4096),
    ]
    started = time.perf_counter()
    for flavour, pattern, value in cases:
        patterns = PatternList.compile([pattern], flavour)  # type: ignore[arg-type]
        assert patterns.match(value) == [], (flavour, pattern)
        near = value + ("B" if flavour == "env" else "b")
        assert patterns.match(near) == [0] or flavour == "host", (flavour, pattern)  # control: a match
    assert time.perf_counter() - started < BOUND_S


_PIECE = st.text(alphabet="ab", max_size=3)


@settings(max_examples=400, deadline=None)
@given(parts=st.lists(_PIECE, min_size=2, max_size=6), value=st.text(alphabet="ab", max_size=12))
def test_the_matcher_agrees_with_shell_globbing(parts: list[str], value: str) -> None:
    pattern = "*".join(parts)
    assume("**" not in pattern)  # '**' is no segment wildcard
    expected = fnmatch.fnmatchcase(value, pattern)
    assert (PatternList.compile([pattern], "command").match(value) == [0]) == expected
    if value:  # one path segment (an empty one is no segment)
        assert (PatternList.compile(["/d/" + pattern], "path").match("/d/" + value) == [0]) == expected
