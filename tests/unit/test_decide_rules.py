"""decide() never answers ALLOW where the documents deny: IP-literal hosts under deny_private,
exactly the declared protocols, denied directories covering their contents, residency at every
safety level, AAIF required capabilities; and property tests over the same rules."""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from enforcer.policy import DocumentRejected, EnvVar, FileAccess, NetworkConnect, ProcessExec, RegionMap, decide
from enforcer.policy.aaif import PROVIDED_CAPABILITIES, capability_findings
from enforcer.policy.adl import validate_adl
from enforcer.policy.compiler import policy_digest
from enforcer.policy.decider import ip_literal
from enforcer.policy.loader import parse_document
from enforcer.policy.model import CompileOptions
from tests.helpers.budgets import examples
from tests.helpers.documents import NOW, base_adl, compile_doc

PROPERTY = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


_COMPILED: dict[str, Any] = {}


def _cached(key: str, build: Any) -> Any:
    """Property tests decide many actions against a few policies: compile each once."""
    if key not in _COMPILED:
        _COMPILED[key] = build()
    return _COMPILED[key]


def _net(schemas: Any, hosts: list[str], **network: Any) -> Any:
    section = {"allowed_hosts": hosts, "allowed_ports": [22, 80, 443], **network}
    return compile_doc(schemas, base_adl(permissions={"network": section}))


def _verdict(policy: Any, action: Any) -> tuple[str, str]:
    decision = decide(policy, action)
    return decision.verdict, decision.reasons[0].rule


# ---- deny_private: a literal host is its own address -------------------------------------------


@pytest.mark.parametrize(
    "host,rule",
    [
        ("10.0.0.5", "net.private_address"),
        ("127.0.0.1", "net.private_address"),
        ("192.168.7.7", "net.private_address"),
        ("169.254.169.254", "net.metadata_address"),
        ("127.1", "net.private_address"),  # the short forms getaddrinfo reads as IPv4
        ("0x7f000001", "net.private_address"),
        ("2130706433", "net.private_address"),
        ("0177.0.0.1", "net.private_address"),
        ("[::1]", "net.private_address"),
        ("::ffff:10.0.0.1", "net.private_address"),
        ("fe80::1%eth0", "net.private_address"),
        ("１２７.０.０.１", "net.private_address"),  # UTS 46 maps these to ASCII digits
        ("localhost", "net.private_address"),  # RFC 6761 names
        ("db.localhost", "net.private_address"),
    ],
)
def test_an_ip_literal_host_is_classified_without_an_address(schemas: Any, host: str, rule: str) -> None:
    for hosts in (["*"], [host.strip("[]")]):
        if hosts != ["*"] and ("%" in host or ":" in host or not host.isascii()):
            continue  # host patterns cannot spell IPv6 literals; '*' covers them
        policy = _net(schemas, hosts)
        assert _verdict(policy, NetworkConnect(host, 443, "tcp")) == ("DENY", rule)


def test_literal_hosts_public_and_with_deny_private_off(schemas: Any) -> None:
    policy = _net(schemas, ["*"])
    assert _verdict(policy, NetworkConnect("8.8.8.8", 443, "tcp"))[0] == "ALLOW"
    # a named address that differs from the literal host: both are classified
    assert _verdict(policy, NetworkConnect("10.0.0.5", 443, "tcp", "8.8.8.8")) == ("DENY", "net.private_address")
    assert _verdict(policy, NetworkConnect("8.8.8.8", 443, "tcp", "10.0.0.5")) == ("DENY", "net.private_address")
    relaxed = _net(schemas, ["*"], deny_private=False)
    assert _verdict(relaxed, NetworkConnect("10.0.0.5", 443, "tcp"))[0] == "ALLOW"
    assert _verdict(relaxed, NetworkConnect("169.254.169.254", 443, "tcp")) == ("DENY", "net.metadata_address")


@pytest.mark.parametrize("host", ["10.0.0.5:443", "a b.example.com", "*.example.com", "x@evil.example.com", "a..b"])
def test_a_host_that_is_neither_name_nor_address_is_refused(schemas: Any, host: str) -> None:
    policy = _net(schemas, ["*", "*.example.com"])
    assert _verdict(policy, NetworkConnect(host, 443, "tcp")) == ("DENY", "net.host_invalid")


# ---- protocols: named must be declared ------------------------------------------------------------


@pytest.mark.parametrize(
    "declared,named,verdict",
    [
        (["wss"], "https", "DENY"),
        (["grpc"], "https", "DENY"),
        (["ws"], "http", "DENY"),
        (["ssh"], "tcp", "DENY"),
        (["postgres"], "tcp", "DENY"),
        (["https"], "tls", "DENY"),
        (["wss"], "wss", "ALLOW"),
        (["ssh"], "ssh", "ALLOW"),
        (["ws"], "ws", "ALLOW"),
        (["tcp"], "https", "ALLOW"),  # a declared tcp covers what TCP carries
        (["tcp"], "tcp", "ALLOW"),
    ],
)
def test_a_named_protocol_must_be_declared(schemas: Any, declared: list[str], named: str, verdict: str) -> None:
    policy = _net(schemas, ["api.example.com"], allowed_protocols=declared)
    got = _verdict(policy, NetworkConnect("api.example.com", 443, named))
    assert got[0] == verdict, got
    if verdict == "DENY":
        assert got[1] == "net.protocol_not_allowed"


# ---- a denied directory covers its contents -------------------------------------------------------


def _fs(schemas: Any, denied: list[str]) -> Any:
    fs = {"allowed_paths": [{"path": "/tmp/**", "access": "read_write"}], "denied_paths": denied}
    return compile_doc(schemas, base_adl(permissions={"filesystem": fs}))


@pytest.mark.parametrize(
    "path",
    [
        "/tmp/processing/x/secrets/key.pem",
        "/tmp/processing/secrets/a/b/c",
        "/tmp/processing/x/y/secrets/key.pem",
        "/tmp/processing/x/secrets",
        "/tmp/processing/x/../y/secrets//key.pem",
    ],
)
def test_the_specs_denied_directory_denies_its_contents(schemas: Any, path: str) -> None:
    policy = _fs(schemas, ["/tmp/processing/**/secrets"])
    for mode in ("read", "write", "read_write"):
        decision = decide(policy, FileAccess(path, mode))  # type: ignore[arg-type]
        assert decision.verdict == "DENY" and decision.reasons[0].rule == "fs.denied", decision
        assert decision.reasons[0].pointer == "/permissions/filesystem/denied_paths/0"


def test_a_path_with_dotdot_is_never_allowed(schemas: Any) -> None:
    # '/tmp/link/../etc/x' is '/tmp/etc/x' only lexically: the kernel follows 'link' first
    policy = _fs(schemas, ["/tmp/processing/**/secrets"])
    assert _verdict(policy, FileAccess("/tmp/link/../x", "read")) == ("DENY", "fs.not_allowed")
    assert _verdict(policy, FileAccess("/tmp/a/../processing/secrets/k", "read")) == ("DENY", "fs.denied")
    assert _verdict(policy, FileAccess("/tmp//a/./x", "read"))[0] == "ALLOW"


def test_beside_a_denied_directory_stays_allowed(schemas: Any) -> None:
    policy = _fs(schemas, ["/tmp/processing/**/secrets"])
    for path in ("/tmp/processing/x/public.txt", "/tmp/processing/x/secrets-old/k", "/tmp/secrets/k"):
        assert decide(policy, FileAccess(path, "read")).verdict == "ALLOW", path


@pytest.mark.parametrize(
    "argv,resolved",
    [(("curl",), "/usr//bin/curl"), (("/usr/bin/../bin/curl",), None), (("x",), "/usr/bin/./curl")],
)
def test_a_denied_command_path_is_matched_normalised(schemas: Any, argv: tuple[str, ...], resolved: str) -> None:
    execution = {"allowed_commands": ["*"], "denied_commands": ["/usr/bin/curl"]}
    policy = compile_doc(schemas, base_adl(permissions={"execution": execution}))
    assert _verdict(policy, ProcessExec(argv, resolved)) == ("DENY", "exec.denied")


def test_a_command_path_with_dotdot_is_never_allowed_by_path(schemas: Any) -> None:
    # the kernel resolves '..' after symlinks: '/x/../usr/bin/jq' is '/usr/bin/jq' only lexically
    execution = {"allowed_commands": ["/usr/bin/jq"], "denied_commands": ["/usr/bin/curl"]}
    policy = compile_doc(schemas, base_adl(permissions={"execution": execution}))
    assert _verdict(policy, ProcessExec(("/x/../usr/bin/jq",))) == ("DENY", "exec.not_allowed")
    assert _verdict(policy, ProcessExec(("/x/../usr/bin/curl",))) == ("DENY", "exec.denied")
    assert _verdict(policy, ProcessExec(("/usr//bin/./jq",)))[0] == "ALLOW"


# ---- residency at every safety level --------------------------------------------------------------

REGIONS = RegionMap.from_data(
    {
        "regions": {
            "EU": {"hosts": ["*.eu.example.test"], "networks": ["198.51.100.0/24"]},
            "US": {"hosts": ["*.us.example.test"], "networks": ["203.0.113.0/24"]},
        }
    }
)


def _residency(schemas: Any, level: str) -> Any:
    aaif = {
        "sc_standard": "SC-006",
        "sc_version": "3.2.0",
        "agent": {"name": "Test Agent", "goal": "t", "compliance": {"safety_level": level, "data_residency": "EU"}},
    }
    adl = base_adl(permissions={"network": {"allowed_hosts": ["*"], "allowed_ports": [443], "deny_private": False}})
    return compile_doc(schemas, adl, aaif, regions=REGIONS)


@pytest.mark.parametrize("level", ["minimal", "standard", "strict", "regulated"])
def test_residency_holds_at_every_safety_level(schemas: Any, level: str) -> None:
    policy = _residency(schemas, level)
    assert _verdict(policy, NetworkConnect("unknown.example.org", 443, "https")) == ("DENY", "net.residency_unknown")
    assert _verdict(policy, NetworkConnect("a.us.example.test", 443, "https")) == ("DENY", "net.residency")
    assert _verdict(policy, NetworkConnect("a.eu.example.test", 443, "https"))[0] == "ALLOW"


# ---- AAIF required_capabilities -------------------------------------------------------------------


def _aaif_caps(level: str, caps: list[str]) -> dict[str, Any]:
    return {
        "sc_standard": "SC-006",
        "sc_version": "3.2.0",
        "agent": {
            "name": "Test Agent",
            "goal": "t",
            "compliance": {"safety_level": level},
            "required_capabilities": caps,
        },
    }


@pytest.mark.parametrize("level", ["strict", "regulated"])
def test_unsatisfied_capability_rejected_at_strict_and_regulated(schemas: Any, level: str) -> None:
    with pytest.raises(DocumentRejected) as caught:
        compile_doc(schemas, base_adl(), _aaif_caps(level, ["compliance.hitl", "tool.mcp"]))
    errors = [f for f in caught.value.findings if f.severity == "error"]
    assert [(f.code, f.pointer) for f in errors] == [("ENF-2010", "/agent/required_capabilities/1")]


@pytest.mark.parametrize("level,consequence", [("standard", "disabled"), ("minimal", "warned only")])
def test_unsatisfied_capability_warned_at_standard_and_minimal(schemas: Any, level: str, consequence: str) -> None:
    policy = compile_doc(schemas, base_adl(), _aaif_caps(level, ["memory.vector"]))
    found = [w for w in policy.warnings if w.code == "ENF-2010"]
    assert len(found) == 1 and consequence in found[0].detail and "memory.vector" in found[0].detail


def test_provided_and_operator_stated_capabilities_are_satisfied(schemas: Any) -> None:
    doc = _aaif_caps("strict", sorted(PROVIDED_CAPABILITIES))
    assert capability_findings(doc) == []
    compile_doc(schemas, base_adl(), doc)
    runtime = _aaif_caps("strict", ["tool.mcp", "compliance.audit_log"])
    policy = compile_doc(schemas, base_adl(), runtime, runtime_capabilities=("tool.mcp",))
    assert not [w for w in policy.warnings if w.code == "ENF-2010"]


# ---- integers beyond 2^53 -------------------------------------------------------------------------


def _with_duration(value: int) -> dict[str, Any]:
    return base_adl(permissions={"resource_limits": {"max_duration_sec": value}})


def test_large_integers_are_valid_json_and_warned_about(schemas: Any) -> None:
    text = json.dumps(_with_duration(2**60)).encode()
    parsed = parse_document(text, "a.json")
    assert parsed.ok, parsed.findings
    findings, _ = validate_adl(parsed.document, schemas, NOW)
    assert [(f.code, f.severity, f.pointer) for f in findings] == [
        ("ENF-1007", "warning", "/permissions/resource_limits/max_duration_sec")
    ]
    policy = compile_doc(schemas, parsed.document)
    assert policy.limits.max_duration_sec == 2**60
    # the digest stays exact: neighbours a double cannot tell apart hash differently
    options = CompileOptions()
    assert policy_digest(_with_duration(2**53 + 1), None, options) != policy_digest(
        _with_duration(2**53 + 2), None, options
    )


def test_large_integer_in_a_signed_document_is_an_error(schemas: Any) -> None:
    doc = _with_duration(2**60)
    doc["security"] = {"attestation": {"type": "self", "signature": {"algorithm": "Ed25519", "value": "AAAA"}}}
    findings, _ = validate_adl(doc, schemas, NOW)
    assert ("ENF-1007", "error") in [(f.code, f.severity) for f in findings]


# ---- properties -------------------------------------------------------------------------------------

_SEGMENT = st.text(alphabet="abcxyz019._-", min_size=1, max_size=6).filter(lambda s: s not in (".", ".."))
_PATTERN_SEGMENT = st.one_of(_SEGMENT, st.just("*"), st.just("**"), _SEGMENT.map(lambda s: s + "*"))


@st.composite
def _denied_and_inside(draw: st.DrawFn) -> tuple[str, str]:
    """A denied pattern and a path it covers: the pattern instantiated, then anything beneath,
    written with detours ('x/..'), '.' and doubled slashes that normalise away."""
    segments = draw(st.lists(_PATTERN_SEGMENT, min_size=1, max_size=5))
    assume(any(s != "**" for s in segments))
    concrete: list[str] = []
    for segment in segments:
        if segment == "**":
            concrete += draw(st.lists(_SEGMENT, max_size=2))
        elif segment == "*":
            concrete.append(draw(_SEGMENT))
        elif segment.endswith("*"):
            concrete.append(segment[:-1] + draw(st.text(alphabet="abc9", max_size=3)))
        else:
            concrete.append(segment)
    concrete += draw(st.lists(_SEGMENT, max_size=3))
    written: list[str] = []
    for part in concrete:
        written += draw(st.sampled_from([[part], [part, "."], ["detour", "..", part], ["", part]]))
    return "/" + "/".join(segments), "/" + "/".join(written)


@PROPERTY
@given(case=_denied_and_inside(), mode=st.sampled_from(["read", "write", "read_write"]))
def test_property_no_allow_under_a_denied_pattern(schemas: Any, case: tuple[str, str], mode: str) -> None:
    pattern, path = case
    fs = {"allowed_paths": [{"path": "/**", "access": "read_write"}], "denied_paths": [pattern]}
    policy = compile_doc(schemas, base_adl(permissions={"filesystem": fs}))
    decision = decide(policy, FileAccess(path, mode))  # type: ignore[arg-type]
    assert decision.verdict == "DENY", (pattern, path, decision)


_NOT_PUBLIC = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
]
_NOT_PUBLIC_V6 = ["::1/128", "fc00::/7", "fe80::/10", "ff00::/8"]


def _forms(address: ipaddress.IPv4Address) -> list[str]:
    """Ways a resolver reads the same IPv4 address from a host name."""
    a, b, c, d = address.packed
    return [
        str(address),
        str(int(address)),
        hex(int(address)),
        f"{a}.{(b << 16) | (c << 8) | d}",
        f"{a}.{b}.{(c << 8) | d}",
        ".".join(oct(x).replace("0o", "0") if x else "0" for x in (a, b, c, d)),
        f"::ffff:{address}",
        f"[::ffff:{address}]",
    ]


@PROPERTY
@given(
    address=st.one_of(*(st.ip_addresses(network=n) for n in _NOT_PUBLIC + _NOT_PUBLIC_V6)),
    form=st.integers(min_value=0, max_value=7),
    named=st.booleans(),
    protocol=st.sampled_from(["tcp", "https", "http"]),
)
def test_property_no_allow_of_a_private_address(
    schemas: Any, address: Any, form: int, named: bool, protocol: str
) -> None:
    policy = _cached("private", lambda: _net(schemas, ["*", "svc.example.test"], allowed_protocols=["tcp"]))
    host = _forms(address)[form] if isinstance(address, ipaddress.IPv4Address) else str(address)
    action = (
        NetworkConnect("svc.example.test", 443, protocol, str(address))
        if named
        else NetworkConnect(host, 443, protocol)
    )
    decision = decide(policy, action)
    assert decision.verdict == "DENY", (host, decision)


_LABEL = st.text(alphabet="abcdefxyz0123-", min_size=1, max_size=8).filter(lambda s: not s.startswith("-"))


@PROPERTY
@given(
    labels=st.lists(_LABEL, min_size=1, max_size=4),
    suffix=st.sampled_from(["example.org", "us.example.test", "eu.example.test.evil", "eu-example.test"]),
    address=st.one_of(st.none(), st.ip_addresses(network="203.0.113.0/24"), st.ip_addresses(v=4)),
    level=st.sampled_from(["minimal", "standard", "strict", "regulated"]),
)
def test_property_no_allow_outside_the_residency_region(
    schemas: Any, labels: list[str], suffix: str, address: Any, level: str
) -> None:
    if address is not None:
        assume(ipaddress.ip_address(address) not in ipaddress.ip_network("198.51.100.0/24"))
    policy = _cached(f"residency-{level}", lambda: _residency(schemas, level))
    host = ".".join([*labels, suffix])
    decision = decide(policy, NetworkConnect(host, 443, "https", None if address is None else str(address)))
    assert decision.verdict == "DENY", (host, address, decision)


_NAME = st.text(alphabet="ABCxyz_19", min_size=1, max_size=6)


@st.composite
def _denied_name(draw: st.DrawFn) -> tuple[str, str]:
    """A name pattern ('*' anywhere) and a name it matches."""
    parts = draw(st.lists(_NAME, min_size=1, max_size=3))
    stars = [draw(st.booleans()) for _ in range(len(parts) + 1)]
    pattern = "".join(("*" if star else "") + part for star, part in zip(stars, [*parts, ""], strict=True))
    name = "".join((draw(_NAME) if star else "") + part for star, part in zip(stars, [*parts, ""], strict=True))
    return pattern, name


@PROPERTY
@given(case=_denied_name())
def test_property_no_allow_of_a_denied_variable(schemas: Any, case: tuple[str, str]) -> None:
    pattern, name = case
    env = {"allowed_variables": ["*", name], "denied_variables": [pattern]}
    policy = compile_doc(schemas, base_adl(permissions={"environment": env}))
    assert decide(policy, EnvVar(name)).verdict == "DENY", case


@PROPERTY
@given(
    case=_denied_name(),
    directory=st.sampled_from(["/usr/bin", "/usr//bin", "/usr/local/../bin", "/bin/."]),
    by_path=st.booleans(),
)
def test_property_no_allow_of_a_denied_command(
    schemas: Any, case: tuple[str, str], directory: str, by_path: bool
) -> None:
    pattern, name = case
    execution = {"allowed_commands": ["*", name], "denied_commands": [pattern], "allow_shell": True}
    policy = compile_doc(schemas, base_adl(permissions={"execution": execution}))
    action = ProcessExec((f"{directory}/{name}",)) if by_path else ProcessExec((name,), f"{directory}/{name}")
    assert decide(policy, action).verdict == "DENY", (case, action)


_PROTOCOLS = ["http", "https", "ws", "wss", "grpc", "tls", "ssh", "postgres", "smtp", "tcp"]


@PROPERTY
@given(
    declared=st.lists(st.sampled_from(_PROTOCOLS), min_size=1, unique=True),
    named=st.sampled_from(_PROTOCOLS),
)
def test_property_a_protocol_allows_only_itself_or_under_tcp(schemas: Any, declared: list[str], named: str) -> None:
    policy = _cached(
        "proto-" + ",".join(sorted(declared)), lambda: _net(schemas, ["h.example.com"], allowed_protocols=declared)
    )
    verdict = decide(policy, NetworkConnect("h.example.com", 443, named)).verdict
    carried = {"http", "https", "ws", "wss", "grpc", "tls", "tcp"}
    assert verdict == ("ALLOW" if named in declared or ("tcp" in declared and named in carried) else "DENY")


def _resolver_reads(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """What the C library makes of a numeric host (AI_NUMERICHOST: no lookup is ever sent)."""
    try:
        infos = socket.getaddrinfo(text, None, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError, ValueError):
        return None
    return ipaddress.ip_address(infos[0][4][0].split("%")[0])


@settings(max_examples=examples(400), deadline=None)
@given(text=st.text(alphabet="0123456789xXaf.:", min_size=1, max_size=14))
def test_property_ip_literal_agrees_with_the_resolver(text: str) -> None:
    resolver = _resolver_reads(text)
    ours = ip_literal(text)
    if resolver is not None:  # whatever the resolver dials without a lookup, decide() classifies
        assert ours is not None and ours == resolver, (text, ours, resolver)
