from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer.policy.patterns import PatternError, PatternList, normalize_host, validate

from ..helpers.budgets import examples


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("api.example.com", "api.example.com", True),
        ("api.example.com", "API.Example.COM", True),
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "deep.sub.example.com", False),  # '*' does not cross dots
        ("*.example.com", "example.com", False),
        ("api-*.example.com", "api-eu.example.com", True),
        ("*", "anything.at.all", True),
        ("example.com.", "example.com", True),  # trailing dot ignored
    ],
)
def test_host_patterns(pattern, value, expected):
    compiled = PatternList.compile([pattern], "host")
    assert bool(compiled.match(normalize_host(value))) is expected


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("/data/**", "/data", True),
        ("/data/**", "/data/", True),
        ("/data/**", "/data/a", True),
        ("/data/**", "/data/a/b/c", True),
        ("/data/**", "/database", False),
        ("/data/*", "/data/a", True),
        ("/data/*", "/data/a/b", False),
        ("/tmp/**/secrets", "/tmp/secrets", True),
        ("/tmp/**/secrets", "/tmp/a/b/secrets", True),
        ("/tmp/**/secrets", "/tmp/a/secrets/x", False),
        ("/etc/*.conf", "/etc/app.conf", True),
        ("/etc/*.conf", "/etc/sub/app.conf", False),
    ],
)
def test_path_patterns(pattern, value, expected):
    assert bool(PatternList.compile([pattern], "path").match(value)) is expected


@pytest.mark.parametrize(
    "pattern,value,expected",
    [
        ("APP_*", "APP_PORT", True),
        ("APP_*", "APP_", True),
        ("APP_*", "XAPP_PORT", False),
        ("HOME", "HOME", True),
        ("HOME", "home", False),
        ("*_TOKEN", "GITHUB_TOKEN", True),
    ],
)
def test_env_patterns(pattern, value, expected):
    assert bool(PatternList.compile([pattern], "env").match(value)) is expected


def test_idna_normalisation():
    assert normalize_host("BÜCHER.example") == "xn--bcher-kva.example"
    assert PatternList.compile(["xn--bcher-kva.example"], "host").match(normalize_host("bücher.example"))


@pytest.mark.parametrize(
    "pattern,flavour",
    [
        ("**.example.com", "host"),
        ("a.**", "host"),
        ("", "host"),
        ("***", "path"),
        ("/a/***/b", "path"),
        ("APP_**", "env"),
        ("py**", "command"),
        ("data/**", "path"),
        ("/a/b**/c", "path"),
        ("a..b", "host"),
        ("http://x.com", "host"),
        ("/a/../b", "path"),
        ("bad name", "env"),
        (42, "host"),
    ],
)
def test_invalid_patterns(pattern, flavour):
    assert validate(pattern, flavour) is not None
    with pytest.raises((PatternError, TypeError)):
        PatternList.compile([pattern], flavour)


def test_patterns_are_not_regexes():
    assert not PatternList.compile(["a.b.com"], "host").match("axb.com")
    paths = PatternList.compile(["/data/(x|y)", "/data/[ab]*", "/data/.+"], "path")
    assert paths.match("/data/(x|y)") == [0] and not paths.match("/data/x")
    assert paths.match("/data/[ab]z") == [1] and not paths.match("/data/az")
    assert not paths.match("/data/xyz") and paths.match("/data/.+") == [2]
    assert not PatternList.compile(["A.B"], "env").match("AXB")
    assert not PatternList.compile(["py.hon"], "command").match("python")


labels = st.text(alphabet="abcxyz0-", min_size=1, max_size=6).filter(lambda s: not s.startswith("-"))
hosts = st.lists(labels, min_size=1, max_size=5).map(".".join)
host_patterns = st.lists(st.one_of(labels, st.just("*"), labels.map(lambda s: s + "*")), min_size=1, max_size=5).map(
    ".".join
)


def _reference_host_match(pattern: str, host: str) -> bool:
    """Independent reference: per-label fnmatch with only '*' special."""
    import fnmatch

    if pattern == "*":
        return True
    p_labels, h_labels = pattern.split("."), host.split(".")
    if len(p_labels) != len(h_labels):
        return False
    for p, h in zip(p_labels, h_labels, strict=True):
        escaped = p.replace("[", "[[]").replace("?", "[?]")
        if not fnmatch.fnmatchcase(h, escaped):
            return False
    return True


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(host_patterns, min_size=1, max_size=8), hosts)
def test_host_trie_agrees_with_reference(pattern_list, host):
    compiled = PatternList.compile(pattern_list, "host")
    expected = sorted(i for i, p in enumerate(pattern_list) if _reference_host_match(p, host))
    assert compiled.match(host) == expected


segments = st.text(alphabet="abc.", min_size=1, max_size=4).filter(lambda s: s not in (".", ".."))
paths = st.lists(segments, min_size=0, max_size=5).map(lambda s: "/" + "/".join(s))
path_patterns = st.lists(
    st.one_of(segments, st.just("*"), st.just("**"), segments.map(lambda s: s + "*")), min_size=1, max_size=5
).map(lambda s: "/" + "/".join(s))


def _reference_path_match(pattern: str, path: str) -> bool:
    import fnmatch

    def go(ps: list[str], xs: list[str]) -> bool:
        if not ps:
            return not xs
        if ps[0] == "**":
            return any(go(ps[1:], xs[i:]) for i in range(len(xs) + 1))
        return (
            bool(xs)
            and fnmatch.fnmatchcase(xs[0], ps[0].replace("[", "[[]").replace("?", "[?]"))
            and go(ps[1:], xs[1:])
        )

    return go([s for s in pattern.split("/") if s], [s for s in path.split("/") if s])


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(path_patterns, min_size=1, max_size=6), paths)
def test_path_trie_agrees_with_reference(pattern_list, path):
    compiled = PatternList.compile(pattern_list, "path")
    expected = sorted(i for i, p in enumerate(pattern_list) if _reference_path_match(p, path))
    assert compiled.match(path) == expected


def test_a_leading_dot_host_pattern_is_refused_with_what_to_write():
    reason = validate(".example.com", "host")
    assert reason is not None and "'example.com' and '*.example.com'" in reason


_PATH_SEGMENT = st.sampled_from(["a", "b", "ab", "x.key", "secrets"])
_PATH_PATTERN_SEGMENT = st.one_of(_PATH_SEGMENT, st.sampled_from(["*", "**", "a*", "*.key"]))


@settings(max_examples=examples(300), deadline=None)
@given(
    patterns=st.lists(st.lists(_PATH_PATTERN_SEGMENT, max_size=4).map(lambda s: "/" + "/".join(s)), min_size=1),
    path=st.lists(_PATH_SEGMENT, max_size=6).map(lambda s: "/" + "/".join(s)),
)
def test_first_covering_is_the_first_match_of_the_path_or_an_ancestor(patterns, path):
    compiled = PatternList.compile(patterns, "path")
    ancestors = [path]
    while ancestors[-1] != "/":
        ancestors.append(ancestors[-1].rsplit("/", 1)[0] or "/")
    hits = [i for a in ancestors for i in compiled.match(a)]
    assert compiled.first_covering(path) == (min(hits) if hits else None)


# Many wildcard segments at the same position, with '*' anywhere in them: the prefix/suffix index
# must answer exactly what matching every pattern one by one answers. Values are drawn both at
# random and by filling a pattern's stars, so near-misses (shared prefix, overlapping ends) occur.
_AFFIX = st.text(alphabet="ab-", max_size=3)
_WILD_SEGMENT = st.lists(_AFFIX, min_size=2, max_size=4).map("*".join).filter(lambda s: "**" not in s)
_FILL = st.text(alphabet="ab-", max_size=3)


def _fill(data: st.DataObject, pattern: str) -> str:
    return "".join(
        part + (data.draw(_FILL) if i < pattern.count("*") else "") for i, part in enumerate(pattern.split("*"))
    )


def _value(data: st.DataObject, patterns: list[str], random_value: st.SearchStrategy[str]) -> str:
    if data.draw(st.booleans()):
        return data.draw(random_value)
    return _fill(data, data.draw(st.sampled_from(patterns)))


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_WILD_SEGMENT.filter(lambda s: not s.startswith("-")), min_size=1, max_size=40), st.data())
def test_host_wildcard_index_agrees_with_matching_one_by_one(wild_labels, data):
    patterns = [f"{label}.example.com" for label in wild_labels] + ["*.example.com", "x*.*.example.com"]
    host = _value(data, patterns, st.text(alphabet="ab-", min_size=1, max_size=7).map(lambda s: s + ".example.com"))
    if any(label == "" or label.startswith("-") for label in host.split(".")):
        host = "a" + host
    compiled = PatternList.compile(patterns, "host")
    assert compiled.match(host) == sorted(i for i, p in enumerate(patterns) if _reference_host_match(p, host))


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(_WILD_SEGMENT, min_size=1, max_size=40), st.data())
def test_path_wildcard_index_agrees_with_matching_one_by_one(wild_segments, data):
    patterns = [f"/d/{segment}/f" for segment in wild_segments] + [f"/d/{wild_segments[0]}/**"]
    path = _value(data, patterns, st.text(alphabet="ab-", min_size=1, max_size=7).map(lambda s: f"/d/{s}/f"))
    compiled = PatternList.compile(patterns, "path")
    assert compiled.match(path) == sorted(i for i, p in enumerate(patterns) if _reference_path_match(p, path))


@settings(max_examples=examples(300), deadline=None)
@given(
    st.lists(st.one_of(_WILD_SEGMENT, _AFFIX), min_size=1, max_size=40), st.data(), st.sampled_from(["env", "command"])
)
def test_name_wildcard_index_agrees_with_matching_one_by_one(names, data, flavour):
    import fnmatch

    names = [n.replace("-", "_") or "N" for n in names]
    value = _value(data, names, st.text(alphabet="ab_", max_size=7))
    compiled = PatternList.compile(names, flavour)
    assert compiled.match(value) == sorted(i for i, p in enumerate(names) if fnmatch.fnmatchcase(value, p))


def test_one_star_segment_needs_room_for_both_ends():
    hosts = PatternList.compile(["ab*ba.example.com", "a*a.example.com"], "host")
    assert hosts.match("aba.example.com") == [1]
    assert hosts.match("abba.example.com") == [0, 1]
    assert hosts.match("a.example.com") == []
