from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer.policy import (
    EnvVar,
    FileAccess,
    NetworkConnect,
    ProcessExec,
    RegionMap,
    ToolCall,
    decide,
)
from tests.helpers.budgets import examples
from tests.helpers.documents import base_adl, compile_doc

TOOLS = [
    {
        "name": "search",
        "description": "s",
        "read_only": True,
        "parameters": {
            "type": "object",
            "required": ["q"],
            "properties": {"q": {"type": "string"}},
            "additionalProperties": False,
        },
    },
    {"name": "pay", "description": "p", "requires_confirmation": True},
    {"name": "write_note", "description": "w"},
]
PERMS = {
    "network": {
        "allowed_hosts": ["api.example.com", "*.cdn.example.com"],
        "allowed_ports": [443, 8443],
        "allowed_protocols": ["https"],
    },
    "filesystem": {
        "allowed_paths": [
            {"path": "/data/**", "access": "read"},
            {"path": "/work/**", "access": "read_write"},
            {"path": "/out/**", "access": "write"},
        ],
        "denied_paths": ["/data/private/**", "/work/**/*.key"],
    },
    "environment": {"allowed_variables": ["APP_*", "LANG"], "denied_variables": ["APP_SECRET_*"]},
    "execution": {
        "allowed_commands": ["python3", "/usr/bin/jq"],
        "denied_commands": ["python3.11"],
        "allow_shell": False,
    },
}


@pytest.fixture(scope="module")
def policy(schemas):
    return compile_doc(schemas, base_adl(tools=TOOLS, permissions=PERMS))


def test_a_schema_failure_never_quotes_the_argument(policy):
    secret = "sk-ant-" + "s" * 30
    for arguments in ({"q": 12345678}, {"q": secret, "extra": secret}, {"q": [secret]}):
        decision = decide(policy, ToolCall("search", arguments))
        assert decision.verdict == "DENY" and decision.reasons[0].rule == "tool.args_invalid"
        text = decision.reasons[0].text
        assert secret not in text and "12345678" not in text, text
        assert "fails the schema's" in text
    missing = decide(policy, ToolCall("search", {}))
    assert '"q" is a required property' in missing.reasons[0].text


def verdict(policy, action):
    d = decide(policy, action)
    return d.verdict, d.reasons[0].rule


@pytest.mark.parametrize(
    "action,expected",
    [
        (ToolCall("search", {"q": "x"}), ("ALLOW", "tool.allowed")),
        (ToolCall("search", {"q": 3}), ("DENY", "tool.args_invalid")),
        (ToolCall("search", {"q": "x", "extra": 1}), ("DENY", "tool.args_invalid")),
        (ToolCall("search", []), ("DENY", "tool.args_invalid")),
        (ToolCall("pay", {}), ("ASK", "tool.requires_confirmation")),
        (ToolCall("rm_rf", {}), ("DENY", "tool.undeclared")),
        (NetworkConnect("api.example.com", 443, "https"), ("ALLOW", "net.allowed")),
        (NetworkConnect("x.cdn.example.com", 8443, "https", "93.184.216.34"), ("ALLOW", "net.allowed")),
        (NetworkConnect("a.b.cdn.example.com", 443, "https"), ("DENY", "net.host_not_allowed")),
        (NetworkConnect("api.example.com", 80, "https"), ("DENY", "net.port_not_allowed")),
        (NetworkConnect("api.example.com", 443, "http"), ("DENY", "net.protocol_not_allowed")),
        (NetworkConnect("api.example.com", 443, "quic"), ("DENY", "net.protocol_not_allowed")),
        (NetworkConnect("api.example.com", 443, "https", "127.0.0.1"), ("DENY", "net.private_address")),
        (NetworkConnect("api.example.com", 443, "https", "::ffff:10.0.0.1"), ("DENY", "net.private_address")),
        (NetworkConnect("api.example.com", 443, "https", "169.254.169.254"), ("DENY", "net.metadata_address")),
        (NetworkConnect("10.0.0.1", 443, "https"), ("DENY", "net.host_not_allowed")),
        (FileAccess("/data/a/b.txt"), ("ALLOW", "fs.allowed")),
        (FileAccess("/data/a/b.txt", "write"), ("DENY", "fs.mode_not_allowed")),
        (FileAccess("/data/private/x"), ("DENY", "fs.denied")),
        (FileAccess("/data/../etc/shadow"), ("DENY", "fs.not_allowed")),
        (FileAccess("/data/x/../private/y"), ("DENY", "fs.denied")),
        (FileAccess("/work/a/b.key", "write"), ("DENY", "fs.denied")),
        (FileAccess("/work/a/b.txt", "read_write"), ("ALLOW", "fs.allowed")),
        (FileAccess("/out/r.txt", "read"), ("DENY", "fs.mode_not_allowed")),
        (FileAccess("relative/path"), ("DENY", "fs.path_invalid")),
        (ProcessExec(("python3", "-V")), ("ALLOW", "exec.allowed")),
        (ProcessExec(("/usr/bin/jq",)), ("ALLOW", "exec.allowed")),
        (ProcessExec(("jq",), "/opt/evil/jq"), ("DENY", "exec.not_allowed")),
        (ProcessExec(("python3.11",)), ("DENY", "exec.denied")),
        (ProcessExec(("sh", "-c", "python3")), ("DENY", "exec.shell")),
        (ProcessExec(("/usr/bin/bash",)), ("DENY", "exec.shell")),
        (ProcessExec(("curl",)), ("DENY", "exec.not_allowed")),
        (EnvVar("APP_PORT"), ("ALLOW", "env.allowed")),
        (EnvVar("APP_SECRET_KEY"), ("DENY", "env.denied")),
        (EnvVar("PATH"), ("DENY", "env.not_allowed")),
    ],
)
def test_decisions(policy, action, expected):
    assert verdict(policy, action) == expected


def test_absent_domains_deny(schemas):
    bare = compile_doc(schemas, base_adl())
    for action in (
        NetworkConnect("a.com", 443),
        FileAccess("/tmp/x"),
        ProcessExec(("ls",)),
        EnvVar("HOME"),
        ToolCall("x"),
    ):
        assert decide(bare, action).verdict == "DENY"


def test_reasons_point_into_document(policy):
    d = decide(policy, FileAccess("/data/private/x"))
    assert d.reasons[0].pointer == "/permissions/filesystem/denied_paths/0"
    d = decide(policy, NetworkConnect("x.cdn.example.com", 443, "https"))
    assert d.reasons[0].pointer == "/permissions/network/allowed_hosts/1"
    assert d.policy_digest == policy.digest


def test_retired_refused_everywhere(schemas):
    p = compile_doc(schemas, base_adl(tools=TOOLS, lifecycle={"status": "retired"}))
    assert p.lifecycle.verdict == "refuse"
    assert verdict(p, ToolCall("search", {"q": "x"})) == ("DENY", "lifecycle.refused")


def test_deprecated_past_sunset_is_retired_and_draft_refused_in_production(schemas):
    p = compile_doc(
        schemas,
        base_adl(
            lifecycle={
                "status": "deprecated",
                "effective_date": "2025-01-01T00:00:00Z",
                "sunset_date": "2026-01-01T00:00:00Z",
            }
        ),
    )
    assert p.lifecycle.verdict == "refuse"
    draft = base_adl(lifecycle={"status": "draft"})
    assert compile_doc(schemas, draft).lifecycle.verdict == "warn"
    assert compile_doc(schemas, draft, production=True).lifecycle.verdict == "refuse"


def test_residency(schemas):
    regions = RegionMap.from_data(
        {
            "regions": {
                "EU": {"hosts": ["*.eu.example.test"], "networks": ["203.0.113.0/25"]},
                "US": {"hosts": ["*.us.example.test"]},
            }
        }
    )
    adl = base_adl(
        permissions={"network": {"allowed_hosts": ["*"], "allowed_ports": [443], "deny_private": False}},
        data_classification={"sensitivity": "internal", "handling": {"cross_border_restricted": True}},
    )
    p = compile_doc(schemas, adl, home_region="EU", regions=regions)
    assert verdict(p, NetworkConnect("a.eu.example.test", 443)) == ("ALLOW", "net.allowed")
    d = decide(p, NetworkConnect("a.us.example.test", 443))
    assert (d.verdict, d.reasons[0].rule) == ("DENY", "net.residency") and "US" in d.reasons[0].text
    assert verdict(p, NetworkConnect("unknown.example", 443)) == ("DENY", "net.residency_unknown")
    # an address in no region leaves the name's region deciding; one in another region denies
    assert verdict(p, NetworkConnect("a.eu.example.test", 443, address="203.0.113.200")) == ("ALLOW", "net.allowed")
    regions2 = RegionMap.from_data(
        {"regions": {"EU": {"hosts": ["*.eu.example.test"]}, "US": {"networks": ["203.0.113.0/24"]}}}
    )
    p2 = compile_doc(schemas, adl, home_region="EU", regions=regions2)
    assert verdict(p2, NetworkConnect("a.eu.example.test", 443, address="203.0.113.7")) == ("DENY", "net.residency")


def test_ports_from_protocols_and_none(schemas):
    p = compile_doc(
        schemas, base_adl(permissions={"network": {"allowed_hosts": ["a.com"], "allowed_protocols": ["https"]}})
    )
    assert verdict(p, NetworkConnect("a.com", 443, "https")) == ("ALLOW", "net.allowed")
    assert verdict(p, NetworkConnect("a.com", 8080, "https")) == ("DENY", "net.port_not_allowed")
    p = compile_doc(schemas, base_adl(permissions={"network": {"allowed_hosts": ["a.com"]}}))
    assert verdict(p, NetworkConnect("a.com", 443, "https")) == ("DENY", "net.port_not_allowed")
    assert any(w.code == "ENF-2004" for w in p.warnings)


names = st.text(alphabet="ABCP_S", min_size=1, max_size=8)
env_patterns = st.lists(st.one_of(names, names.map(lambda s: s + "*")), max_size=5)


@settings(max_examples=examples(200), deadline=None)
@given(env_patterns, env_patterns, names)
def test_deny_always_wins_env(schemas, allowed, denied, name):
    adl = base_adl(permissions={"environment": {"allowed_variables": allowed, "denied_variables": denied}})
    p = compile_doc(schemas, adl)
    d = decide(p, EnvVar(name))
    deny_matches = p.environment.denied.match(name)
    if deny_matches:
        assert d.verdict == "DENY"
    elif d.verdict == "ALLOW":
        assert p.environment.allowed.match(name)


path_seg = st.sampled_from(["a", "b", "c", "*", "**"])
fs_patterns = st.lists(st.lists(path_seg, min_size=1, max_size=3).map(lambda s: "/" + "/".join(s)), max_size=4)


@settings(max_examples=examples(200), deadline=None)
@given(
    fs_patterns,
    fs_patterns,
    st.lists(st.sampled_from(["a", "b", "c", ".."]), max_size=4),
    st.sampled_from(["read", "write", "read_write"]),
)
def test_deny_always_wins_fs(schemas, allowed, denied, parts, mode):
    adl = base_adl(
        permissions={
            "filesystem": {
                "allowed_paths": [{"path": p, "access": "read_write"} for p in allowed],
                "denied_paths": denied,
            }
        }
    )
    p = compile_doc(schemas, adl)
    path = "/" + "/".join(parts)
    d = decide(p, FileAccess(path, mode))
    import posixpath

    if p.filesystem.denied.match(posixpath.normpath(path).replace("//", "/")):
        assert d.verdict == "DENY"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
    max_leaves=10,
)
actions = st.one_of(
    st.builds(ToolCall, st.one_of(st.sampled_from(["search", "pay", "write_note"]), st.text(max_size=8)), json_values),
    st.builds(
        NetworkConnect,
        st.text(max_size=30),
        st.integers(-5, 70000),
        st.text(max_size=6),
        st.one_of(st.none(), st.text(max_size=20), st.ip_addresses().map(str)),
    ),
    st.builds(FileAccess, st.text(max_size=30), st.sampled_from(["read", "write", "read_write", "x"])),
    st.builds(ProcessExec, st.lists(st.text(max_size=10), max_size=3).map(tuple)),
    st.builds(EnvVar, st.text(max_size=10)),
)


@settings(max_examples=examples(600), deadline=None)
@given(actions)
def test_decide_never_raises_and_is_deterministic(policy, action):
    first = decide(policy, action)
    assert first.verdict in ("ALLOW", "DENY", "ASK")
    assert first.reasons
    assert decide(policy, action) == first
