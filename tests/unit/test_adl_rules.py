"""Semantic rules the fixtures do not cover: 0.3's VAL-29..37, profiles, templates, schemas, limits."""

from __future__ import annotations

import json

import pytest

from enforcer.policy.adl import validate_adl
from tests.helpers.documents import NOW, base_adl


def codes(schemas, doc):
    findings, _ = validate_adl(doc, schemas, NOW)
    return sorted({f.code for f in findings if f.severity == "error"})


@pytest.mark.parametrize(
    "extra,code",
    [
        ({"permissions": {"resource_limits": {"budget": {"tokens": {"per_session": 0}}}}}, "ADL-6001"),
        ({"permissions": {"resource_limits": {"budget": {"tokens": {"per_session": 10, "per_day": 5}}}}}, "ADL-6002"),
        ({"runtime": {"degradation": {"on_budget_exhausted": {"action": "explode"}}}}, "ADL-6003"),
        ({"runtime": {"tool_invocation": {"max_iterations": 0}}}, "ADL-6004"),
        ({"runtime": {"tool_invocation": {"loop_detection": {"window": 1}}}}, "ADL-6005"),
        ({"permissions": {"delegation": {"match": ["**.example.com"]}}}, "ADL-6006"),
        ({"permissions": {"delegation": {"max_depth": 0}}}, "ADL-6007"),
        ({"runtime": {"degradation": {"OnBad": {"action": "halt"}}}}, "ADL-6008"),
        ({"permissions": {"sub_agents": [{"name": "a", "tools": ["missing"]}]}}, "ADL-6009"),
        ({"permissions": {"sub_agents": [{"name": "a"}, {"name": "a"}]}}, "ADL-6009"),
        ({"metadata": {"related": "urn:adl:acme:thing:1.0.0"}}, "ADL-2025"),
        ({"system_prompt": {"template": "Hi {{user}}", "variables": {}}}, "ADL-2024"),
        ({"lifecycle": {"status": "active", "sunset_date": "2026-01-01T00:00:00Z"}}, "ADL-5003"),
        ({"lifecycle": {"status": "active", "effective_date": "yesterday"}}, "ADL-2005"),
        ({"id": "not a uri"}, "ADL-2006"),
        ({"tools": [{"name": "t", "description": "d", "parameters": {"type": "objectx"}}]}, "ADL-2007"),
        (
            {"tools": [{"name": "t", "description": "d", "parameters": {"$ref": "https://evil.example/s.json"}}]},
            "ADL-2007",
        ),
        ({"permissions": {"filesystem": {"allowed_paths": [{"path": "relative/**", "access": "read"}]}}}, "ADL-2017"),
        ({"permissions": {"environment": {"allowed_variables": ["A**"]}}}, "ADL-2018"),
        ({"permissions": {"execution": {"allowed_commands": [""]}}}, "ADL-2018"),
        ({"profiles": ["urn:adl:profile:governance:1.0"]}, "ADL-3001"),
        ({"profiles": ["https://vendor.example/profile/v1"]}, "ADL-3002"),
    ],
)
def test_rule(schemas, extra, code):
    assert code in codes(schemas, base_adl(**extra))


def test_undefined_template_var_is_1006_before_03(schemas):
    doc = base_adl(adl_spec="0.1.0", system_prompt={"template": "Hi {{user}}", "variables": {}})
    assert "ADL-1006" in codes(schemas, doc)
    escaped = base_adl(system_prompt={"template": "literal \\{{user}} ok", "variables": {}})
    assert codes(schemas, escaped) == []


def test_all_errors_in_one_pass(schemas):
    doc = base_adl(
        tools=[{"name": "Bad", "description": "d"}, {"name": "Bad", "description": "d"}],
        model={"temperature": 9},
        lifecycle={"status": "active", "successor": "urn:x:y"},
        permissions={"network": {"allowed_hosts": ["**"]}},
    )
    assert {"ADL-2002", "ADL-2008", "ADL-2010", "ADL-5002", "ADL-2016"} <= set(codes(schemas, doc))


def test_patch_versions_share_the_minor_schema(schemas):
    assert codes(schemas, base_adl(adl_spec="0.2.7")) == []
    assert "ADL-2001" in codes(schemas, base_adl(adl_spec="0.4.0"))
    assert "ADL-2001" in codes(schemas, base_adl(adl_spec="1.0.0"))


def test_unknown_member_rejected_but_extensions_kept(schemas):
    assert "ADL-1004" in codes(schemas, base_adl(surprise=True))
    assert codes(schemas, base_adl(extensions={"com.acme": {"x": 1}})) == []
    assert codes(schemas, base_adl(adl_spec="0.1.0", x_acme_id="7")) == []


def test_error_format_matches_draft(schemas):
    findings, _ = validate_adl(
        base_adl(tools=[{"name": "a", "description": "d"}, {"name": "a", "description": "d"}]), schemas, NOW
    )
    out = {"errors": [f.to_json() for f in findings]}
    assert json.loads(json.dumps(out)) == {
        "errors": [
            {
                "code": "ADL-2002",
                "title": "Duplicate tool name",
                "detail": "Tool name 'a' already defined at index 0",
                "source": {"pointer": "/tools/1/name"},
            }
        ]
    }


def test_never_raises_on_wrong_types(schemas):
    weird = base_adl(
        tools="x",
        resources=[1, None],
        prompts={"a": 1},
        permissions=[],
        lifecycle=3,
        security="s",
        runtime={"degradation": [], "tool_invocation": "x"},
        model=[],
        profiles="p",
        data_classification={"sensitivity": 5, "categories": "pii", "retention": []},
    )
    assert codes(schemas, weird)  # errors, not exceptions


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from enforcer.policy import DocumentRejected, compile_policy  # noqa: E402
from tests.helpers.budgets import examples  # noqa: E402
from tests.helpers.documents import EXAMPLES, json_paths, set_at  # noqa: E402

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=20,
)
_SEED = json.loads((EXAMPLES / "coding-agent.adl.json").read_text())


_ALL_PATHS = list(json_paths(_SEED))


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.sampled_from(_ALL_PATHS), _json)
def test_mutated_documents_give_structured_errors_only(schemas, path, value):
    doc = json.loads(json.dumps(_SEED))
    set_at(doc, path, value)
    try:
        compile_policy(doc, None, schemas, NOW)
    except DocumentRejected as exc:
        assert exc.findings and all(f.code for f in exc.findings)


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        st.sampled_from(
            [
                "adl_spec",
                "name",
                "tools",
                "permissions",
                "lifecycle",
                "security",
                "data_classification",
                "runtime",
                "profiles",
                "x",
            ]
        ),
        _json,
        max_size=8,
    )
)
def test_random_documents_give_structured_errors_only(schemas, doc):
    doc.setdefault("adl_spec", "0.3.0")
    try:
        compile_policy(doc, None, schemas, NOW)
    except DocumentRejected as exc:
        assert exc.findings


def warnings_of(schemas, doc):
    findings, _ = validate_adl(doc, schemas, NOW)
    assert not [f for f in findings if f.severity == "error"], findings
    return [(f.code, f.pointer) for f in findings if f.severity == "warning"]


def _paths(*entries: str) -> dict:
    return {"filesystem": {"allowed_paths": [{"path": p, "access": "read"} for p in entries]}}


@pytest.mark.parametrize(
    "permissions,code,pointer",
    [
        (
            {"network": {"allowed_hosts": ["*example.com"], "allowed_ports": [443]}},
            "ENF-2011",
            "network/allowed_hosts/0",
        ),
        ({"network": {"allowed_hosts": ["*"], "allowed_ports": [443]}}, "ENF-2003", "network/allowed_hosts/0"),
        ({"environment": {"allowed_variables": ["LANG", "*"]}}, "ENF-2003", "environment/allowed_variables/1"),
        ({"execution": {"allowed_commands": ["*"]}}, "ENF-2003", "execution/allowed_commands/0"),
        ({"execution": {"allowed_commands": ["/usr/bin/../bin/x"]}}, "ENF-2011", "execution/allowed_commands/0"),
        ({"execution": {"allowed_commands": ["bin/tool"]}}, "ENF-2011", "execution/allowed_commands/0"),
        ({"execution": {"denied_commands": ["/usr//bin/curl"]}}, "ENF-2011", "execution/denied_commands/0"),
        (_paths("/data/"), "ENF-2011", "filesystem/allowed_paths/0/path"),
        (_paths("/srv/app"), "ENF-2011", "filesystem/allowed_paths/0/path"),
        (_paths("/**"), "ENF-2003", "filesystem/allowed_paths/0/path"),
    ],
)
def test_patterns_that_grant_other_than_they_look_are_warned(schemas, permissions, code, pointer):
    assert warnings_of(schemas, base_adl(permissions=permissions)) == [(code, "/permissions/" + pointer)]


def test_precise_patterns_are_not_warned(schemas):
    permissions = {
        "network": {"allowed_hosts": ["example.com", "*.example.com", "api-*.example.com"], "allowed_ports": [443]},
        "environment": {"allowed_variables": ["APP_*"]},
        "execution": {"allowed_commands": ["python3", "/usr/bin/jq"], "denied_commands": ["curl"]},
        **_paths("/data/**", "/etc/app.conf"),
    }
    assert warnings_of(schemas, base_adl(permissions=permissions)) == []


@pytest.mark.parametrize(
    "lifecycle,expected",
    [
        ({"status": "active", "sunset_date": "2026-12-01T00:00:00Z"}, [("ENF-2007", "/lifecycle/sunset_date")]),
        ({"status": "deprecated", "sunset_date": "2026-12-01T00:00:00Z"}, [("ENF-2007", "/lifecycle/sunset_date")]),
        ({"status": "deprecated", "sunset_date": "2026-11-01T00:00:00Z"}, [("ADL-5003", "/lifecycle/sunset_date")]),
        ({"status": "active", "sunset_date": "2027-06-01T00:00:00Z"}, []),
    ],
)
def test_lifecycle_sunset_warnings(schemas, lifecycle, expected):
    assert warnings_of(schemas, base_adl(lifecycle=lifecycle)) == expected


def test_missing_adl_spec_is_1003_not_a_version_error(schemas):
    doc = base_adl()
    del doc["adl_spec"]
    assert codes(schemas, doc) == ["ADL-1003"]
