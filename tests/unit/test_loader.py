from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer.policy.loader import MAX_DOCUMENT_BYTES, parse_document

from ..helpers.budgets import examples


def codes(data: bytes, name: str | None = None) -> list[str]:
    return [f.code for f in parse_document(data, name).findings]


def test_yaml_timestamps_stay_strings():
    parsed = parse_document(b"adl_spec: 0.3.0\nwhen: 2026-01-01T00:00:00Z\nday: 2026-01-01\nflag: yes\n")
    assert parsed.ok and parsed.kind == "adl"
    assert parsed.document["when"] == "2026-01-01T00:00:00Z"
    assert parsed.document["day"] == "2026-01-01"
    assert parsed.document["flag"] == "yes"  # YAML 1.2: 'yes' is a string


def test_size_limit_checked_before_parsing():
    assert codes(b" " * (MAX_DOCUMENT_BYTES + 1)) == ["ENF-1001"]


def test_depth_limit():
    deep = b'{"a":' * 40 + b"1" + b"}" * 40
    assert codes(deep, "x.json") == ["ENF-1002"]
    assert codes(b"[" * 200_000, "x.json") == ["ENF-1002"]


def test_yaml_alias_expansion_is_bounded():
    lines = ["a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    prev = "a"
    for name in "bcdefgh":
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
        prev = name
    assert codes("\n".join(lines).encode()) == ["ENF-1001"]


def test_duplicate_members_rejected_in_json_and_yaml():
    assert codes(b'{"permissions": {}, "permissions": {"network": {}}}', "d.json") == ["ADL-1001"]
    assert codes(b"a: 1\na: 2\n", "d.yaml") == ["ADL-1001"]


def test_non_object_and_bad_json():
    assert codes(b"[1, 2]", "x.json") == ["ADL-1002"]
    assert codes(b"{not json", "x.json") == ["ADL-1001"]
    assert codes(b'{"x": NaN}', "x.json") == ["ADL-1001"]
    assert codes(b"\xff\xfe", "x.json") == ["ADL-1001"]


def test_count_limits():
    tools = [{"name": f"t{i}", "description": "d"} for i in range(1001)]
    assert codes(json.dumps({"adl_spec": "0.3.0", "tools": tools}).encode(), "x.json") == ["ENF-1003"]
    hosts = [f"h{i}.example.com" for i in range(501)]
    doc = {"adl_spec": "0.3.0", "permissions": {"network": {"allowed_hosts": hosts}}}
    assert codes(json.dumps(doc).encode(), "x.json") == ["ENF-1003"]
    paths = {
        "allowed_paths": [{"path": f"/d{i}", "access": "read"} for i in range(300)],
        "denied_paths": [f"/x{i}" for i in range(201)],
    }
    assert codes(json.dumps({"adl_spec": "0.3.0", "permissions": {"filesystem": paths}}).encode(), "x.json") == [
        "ENF-1003"
    ]


def test_kind_detection():
    assert parse_document(b'{"adl_spec": "0.1.0"}', "a.json").kind == "adl"
    assert parse_document(b'{"sc_standard": "SC-006", "agent": {}}', "a.json").kind == "aaif"
    assert parse_document(b'{"hello": 1}', "a.json").kind is None


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=2048))
def test_random_bytes_never_raise(data):
    result = parse_document(data)
    assert result.ok or result.findings


@settings(max_examples=examples(200), deadline=None)
@given(st.text(max_size=1024))
def test_random_yaml_text_never_raises(text):
    result = parse_document(text.encode("utf-8"), "x.yaml")
    assert result.ok or result.findings


def test_integers_beyond_two_to_the_53_are_valid_json():
    for text in (b'{"n": 9007199254740993}', b'{"n": -18446744073709551616}', b"n: 9007199254740993\n"):
        parsed = parse_document(text, "d.yaml" if text.startswith(b"n:") else "d.json")
        assert parsed.ok and parsed.findings == (), parsed.findings
        assert abs(parsed.document["n"]) > 2**53
