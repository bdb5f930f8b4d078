from __future__ import annotations

import copy

import pytest

from enforcer.policy import DocumentRejected, ToolCall, decide
from enforcer.policy.aaif import validate_aaif
from enforcer.policy.credentials import credential_reason, find_inline_credentials
from enforcer.policy.pii import scan_leaves
from tests.helpers.documents import base_adl, compile_doc

TOOLS = [
    {"name": "read_doc", "description": "r", "read_only": True},
    {
        "name": "send_money",
        "description": "s",
        "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "memo": {"type": "string"}}},
    },
]


def aaif(compliance=None, tools=None, name="Test Agent"):
    agent = {"name": name, "goal": "test"}
    if compliance is not None:
        agent["compliance"] = compliance
    if tools is not None:
        agent["tools"] = tools
    return {"sc_standard": "SC-006", "sc_version": "3.2.0", "agent": agent}


def policy(schemas, compliance=None, tools=None, **kw):
    return compile_doc(schemas, base_adl(tools=TOOLS), aaif(compliance, tools, **kw))


def v(p, name, args=None):
    return decide(p, ToolCall(name, args or {})).verdict


def test_hitl_jsonlogic_condition(schemas):
    p = policy(
        schemas,
        {
            "human_in_the_loop": {
                "enabled": True,
                "timeout_seconds": 60,
                "trigger": {"lang": "jsonlogic", "expr": {">": [{"var": "arguments.amount"}, 100]}},
            }
        },
    )
    assert v(p, "send_money", {"amount": 50}) == "ALLOW"
    d = decide(p, ToolCall("send_money", {"amount": 500}))
    assert d.verdict == "ASK" and d.obligations["approval_timeout_s"] == 60


def test_hitl_jsonpath_and_always_never(schemas):
    p = policy(
        schemas, {"human_in_the_loop": {"enabled": True, "trigger": {"lang": "jsonpath", "expr": "$.arguments.memo"}}}
    )
    assert v(p, "send_money", {"amount": 1}) == "ALLOW"
    assert v(p, "send_money", {"amount": 1, "memo": "x"}) == "ASK"
    assert (
        v(policy(schemas, {"human_in_the_loop": {"enabled": True, "trigger": {"lang": "always"}}}), "read_doc") == "ASK"
    )
    assert (
        v(policy(schemas, {"human_in_the_loop": {"enabled": True, "trigger": {"lang": "never"}}}), "send_money")
        == "ALLOW"
    )
    assert (
        v(policy(schemas, {"human_in_the_loop": {"enabled": False, "trigger": {"lang": "always"}}}), "read_doc")
        == "ALLOW"
    )


def test_string_trigger_gates_writes_and_warns(schemas):
    p = policy(schemas, {"human_in_the_loop": {"enabled": True, "trigger": "before any write"}})
    assert v(p, "read_doc") == "ALLOW"
    assert v(p, "send_money") == "ASK"
    assert any(w.code == "ENF-2009" for w in p.warnings)


@pytest.mark.parametrize(
    "level,expected", [("minimal", ("ALLOW", "ASK")), ("standard", ("ASK", "ASK")), (None, ("ASK", "ASK"))]
)
def test_unsupported_condition_by_safety_level(schemas, level, expected):
    compliance = {"human_in_the_loop": {"enabled": True, "trigger": {"lang": "cel", "expr": "amount > 1"}}}
    if level:
        compliance["safety_level"] = level
    p = policy(schemas, compliance)
    assert (v(p, "read_doc"), v(p, "send_money")) == expected
    assert any(w.code == "ENF-2002" for w in p.warnings)


@pytest.mark.parametrize("level", ["strict", "regulated"])
def test_unsupported_condition_rejected_when_strict(schemas, level):
    compliance = {
        "safety_level": level,
        "human_in_the_loop": {"enabled": True, "trigger": {"lang": "cel", "expr": "amount > 1"}},
    }
    with pytest.raises(DocumentRejected) as exc:
        policy(schemas, compliance)
    assert "ENF-2002" in [f.code for f in exc.value.findings if f.severity == "error"]


@pytest.mark.parametrize(
    "mode,expected", [("reject", "DENY"), ("detect", "ALLOW"), ("anonymize", "ALLOW"), ("none", "ALLOW")]
)
def test_pii_modes(schemas, mode, expected):
    p = policy(schemas, {"pii_handling": mode})
    call = ToolCall("send_money", {"amount": 1, "memo": "card 4111 1111 1111 1111"})
    d = decide(p, call)
    assert d.verdict == expected
    assert decide(p, call, pii=scan_leaves(call.arguments)) == d  # the arguments searched by the caller
    assert decide(p, call, pii={}).verdict == "ALLOW"  # the caller's search is trusted, not repeated
    if mode in ("detect", "anonymize"):
        assert d.obligations["pii"]["kinds"] == ["payment_card"]
    if mode == "anonymize":
        assert d.obligations["mask"] == ["/memo"]
    if mode == "none":
        assert "pii" not in d.obligations
    assert decide(p, ToolCall("send_money", {"amount": 1, "memo": "card 4111 1111 1111 1112"})).verdict == "ALLOW"


def test_audit_and_residency_extracted(schemas):
    p = policy(schemas, {"audit_log": True, "data_residency": "EU"})
    assert p.audit_required and [r.region for r in p.residency] == ["EU"]
    assert not policy(schemas, {"data_residency": "global"}).residency


def test_auth_env_var_and_aaif_only_tools(schemas):
    tools = [
        {
            "name": "send_money",
            "description": "s",
            "auth": {"type": "bearer", "env_var": "PAY_TOKEN"},
            "parameters_schema": {"type": "object", "required": ["amount"]},
        },
        {"name": "shadow_tool", "description": "x"},
    ]
    p = policy(schemas, {}, tools)
    assert p.secret_env == {"PAY_TOKEN"}
    assert v(p, "send_money", {"memo": "no amount"}) == "DENY"  # the AAIF schema is checked too
    d = decide(p, ToolCall("shadow_tool", {}))
    assert d.verdict == "DENY" and "AAIF" in d.reasons[0].text


def test_agents_must_match(schemas):
    with pytest.raises(DocumentRejected) as exc:
        policy(schemas, {}, name="Someone Else")
    assert "ENF-2005" in [f.code for f in exc.value.findings]


@pytest.mark.parametrize(
    "doc",
    [
        {"agent": {"tools": [{"name": "t", "endpoint": "https://user:hunter2@api.example.com/x"}]}},
        {"agent": {"tools": [{"name": "t", "endpoint": "https://api.example.com/x?api_key=abc123"}]}},
        {"x-vendor": {"password": "hunter2"}},
        {"agent": {"instructions": "use key sk-proj-abcdefghijklmnopqrstuvwxyz0123"}},
        {"agent": {"notes": "-----BEGIN OPENSSH PRIVATE KEY-----\nabc"}},
        {"x_acme": {"aws": "AKIAIOSFODNN7EXAMPLE"}},
        {"agent": {"header": "Authorization: Bearer abcdefghijklmnopqrstuvwxyz"}},
    ],
)
def test_inline_credentials_found(doc):
    assert list(find_inline_credentials(doc))


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("-----BEGIN RSA PRIVATE KEY-----", "private key"),
        ("id AKIAIOSFODNN7EXAMPLE", "AWS access key"),
        ("ghp_" + "a" * 36, "GitHub token"),
        ("xoxb-1234567890-abcdef", "Slack token"),
        ("sk-ant-" + "b" * 30, "API secret key"),
        ("AIza" + "c" * 35, "Google API key"),
        ("eyJhbGciOiJI.eyJzdWIiOiIx.abcdefghij", "JSON Web Token"),
        ("Basic dXNlcjpwYXNzd29yZDEyMzQ=", "bearer credential"),
        # two kinds in one value: the first in the list names it
        ("Bearer abcdefghijklmnopqrstuvwxyz and AKIAIOSFODNN7EXAMPLE", "AWS access key"),
    ],
)
def test_each_secret_value_kind_is_named(value, kind):
    assert credential_reason("data", value) == f"value looks like a {kind}"
    assert credential_reason("data", "src/app.py and nothing secret") is None


def test_credential_references_are_fine(spec):
    import json

    for path in sorted((spec / "Observalytics-SL__aaif").rglob("*.json")):
        if "tests/conformance/invalid" in str(path):
            continue
        assert not list(find_inline_credentials(json.loads(path.read_text()))), path


def test_inline_credential_rejects_compile(schemas):
    doc = base_adl(tools=copy.deepcopy(TOOLS))
    doc["tools"][0]["annotations"] = {"openapi_ref": "https://u:secretpw@api.example.com/openapi.json"}
    with pytest.raises(DocumentRejected) as exc:
        compile_doc(schemas, doc)
    assert "ENF-2001" in [f.code for f in exc.value.findings]


def test_a_plain_allow_is_the_policys_shared_decision_and_nothing_else_is(schemas):
    p = policy(
        schemas,
        {
            "pii_handling": "detect",
            "human_in_the_loop": {
                "enabled": True,
                "trigger": {"lang": "jsonlogic", "expr": {">": [{"var": "arguments.amount"}, 100]}},
            },
        },
    )
    plain = decide(p, ToolCall("send_money", {"amount": 1, "memo": "rent"}))
    assert plain is decide(p, ToolCall("send_money", {"amount": 2})) is p.tool_allowed["send_money"]
    assert (plain.verdict, [r.rule for r in plain.reasons]) == ("ALLOW", ["tool.allowed"])
    with_pii = decide(p, ToolCall("send_money", {"amount": 1, "memo": "mail ops@acme.example"}))
    asks = decide(p, ToolCall("send_money", {"amount": 500}))
    assert with_pii.verdict == "ALLOW" and "pii" in with_pii.obligations and with_pii is not plain
    assert asks.verdict == "ASK" and asks is not plain
    assert decide(p, ToolCall("read_doc", {})) is p.tool_allowed["read_doc"] is not plain


def test_an_unknown_x_sc_schema_is_a_finding_not_a_crash(schemas):
    doc = {"x-sc-schema": "profile.schema.json", "sc_standard": "SC-006", "agent": {"name": "a", "goal": "g"}}
    findings = validate_aaif(doc, schemas)
    assert [(f.code, f.pointer) for f in findings] == [("AAIF-1001", "/x-sc-schema")]
    with pytest.raises(DocumentRejected):
        compile_doc(schemas, base_adl(), doc)
