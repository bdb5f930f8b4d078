"""adl-audit search/show/report, masking and session evidence."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer.audit import AuditWriter, Masker, records
from enforcer.audit.events import decision_payload
from enforcer.audit.evidence import EvidenceEvent, build_evidence, evidence_problem
from enforcer.audit.keys import load_or_create
from enforcer.audit.query import QueryError, parse_seq_range, parse_time
from enforcer.cli.audit import main as audit_main
from enforcer.policy import FileAccess, NetworkConnect, ToolCall, decide
from enforcer.policy.errors import pointer
from enforcer.policy.jsonvalues import iter_strings, member_name
from enforcer.policy.pii import scan_leaves

from ..helpers.budgets import examples
from ..helpers.documents import base_adl, compile_doc

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def run(capsys: pytest.CaptureFixture[str], directory: Path, *argv: str) -> tuple[int, list[str]]:
    code = audit_main(["--dir", str(directory), *argv])
    out = capsys.readouterr().out
    return code, [line for line in out.splitlines() if line]


@pytest.fixture
def populated(tmp_path: Path, schemas: Any) -> Path:
    policy = compile_doc(
        schemas,
        base_adl(
            id="urn:adl:agent:acme:reader:1.0.0",
            tools=[{"name": "lookup", "description": "d", "parameters": {"type": "object"}}],
            permissions={
                "network": {"allowed_hosts": ["api.example.com"], "allowed_protocols": ["https"]},
                "filesystem": {"allowed_paths": [{"path": "/data/**", "access": "read"}]},
            },
        ),
    )
    masker = Masker()
    directory = tmp_path / "audit"
    actions = [
        ToolCall("lookup", {"q": "x"}),
        ToolCall("delete_all", {}),
        NetworkConnect("api.example.com", 443, "https"),
        NetworkConnect("evil.example.net", 443, "https"),
        FileAccess("/data/a.txt", "read"),
        FileAccess("/etc/shadow", "read"),
    ]
    with AuditWriter(directory, tmp_path / "k.pem") as writer:
        writer.append(records.LAUNCH, {"agent": "urn:adl:agent:acme:reader:1.0.0"}, corr="session-0001")
        for action in actions:
            payload = decision_payload(policy, action, decide(policy, action), masker)
            writer.append(records.DECISION, payload, corr="session-0001")
        writer.append(
            records.DECISION,
            {"agent": "urn:adl:agent:other:x:1.0.0", "decision": "ask", "tool": "pay"},
            corr="session-0002",
        )
        writer.append(
            records.EXIT,
            {"agent": "urn:adl:agent:acme:reader:1.0.0", "reason": "timeout", "exit_code": 137},
            corr="session-0001",
        )
    return directory


def test_search_filters_and_or(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(capsys, populated, "search", "--decision", "deny")
    assert code == 0 and len(lines) == 3 and all(" DENY " in line for line in lines)
    code, lines = run(capsys, populated, "search", "--decision", "deny", "--decision", "ask")
    assert len(lines) == 4
    code, lines = run(capsys, populated, "search", "--decision", "deny", "--host", "evil.*")
    assert len(lines) == 1 and "host=evil.example.net" in lines[0]
    code, lines = run(capsys, populated, "search", "--rule", "fs.*", "--decision", "deny")
    assert len(lines) == 1 and "path=/etc/shadow" in lines[0]
    code, lines = run(capsys, populated, "search", "--agent", "urn:adl:agent:other:*")
    assert len(lines) == 1 and "tool=pay" in lines[0]
    code, lines = run(capsys, populated, "search", "--session", "session-0001", "--type", "launch", "--type", "exit")
    assert len(lines) == 2
    code, lines = run(capsys, populated, "search", "--tool", "lookup", "--path", "/data/*")
    assert code == 1 and lines == []  # ANDed across fields: no record has both


def test_search_seq_time_json_limit_reverse(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, lines = run(capsys, populated, "search", "--seq", "3..5", "--json")
    assert [json.loads(line)["seq"] for line in lines] == [3, 4, 5]
    _, lines = run(capsys, populated, "search", "--since", "-1h", "-n", "2", "--reverse", "--json")
    seqs = [json.loads(line)["seq"] for line in lines]
    assert len(seqs) == 2 and seqs[0] > seqs[1]
    assert run(capsys, populated, "search", "--until", "-1h")[0] == 1
    assert run(capsys, populated, "search", "--since", "today")[0] == 0
    assert run(capsys, populated, "search", "--since", "2999-01-01T00:00Z")[0] == 1
    assert run(capsys, populated, "search", "--since", "last tuesday")[0] == 2


def test_show_by_seq_and_id(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(capsys, populated, "show", "4", "--json")
    record = json.loads(lines[0])
    assert code == 0 and record["seq"] == 4
    code, lines = run(capsys, populated, "show", record["id"], "--json")
    assert json.loads(lines[0]) == record
    assert run(capsys, populated, "show", "99999")[0] == 1


def test_report(populated: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = run(capsys, populated, "report", "--json")
    summary = json.loads("\n".join(lines))
    assert summary["by_decision"] == {"deny": 3, "allow": 3, "ask": 1}
    assert summary["by_tool"] == {"lookup": 1, "delete_all": 1, "pay": 1}
    assert {d["what"] for d in summary["top_denials"]} == {
        "tool.undeclared tool=delete_all",
        "net.host_not_allowed host=evil.example.net",
        "fs.not_allowed path=/etc/shadow",
    }
    session = next(s for s in summary["sessions"] if s["session"] == "session-0001")
    assert session["reason"] == "timeout" and session["exit_code"] == 137
    code, lines = run(capsys, populated, "report")
    assert code == 0 and any("timeout (exit code 137)" in line for line in lines)


def test_time_words_and_errors() -> None:
    assert parse_time("-1h", NOW) == parse_time("2026-11-21T11:00:00Z", NOW)
    assert parse_time("-2d", NOW) == parse_time("2026-11-19T12:00:00+00:00", NOW)
    assert parse_time("this-week", NOW) <= parse_time("today", NOW)
    assert parse_time("yesterday", NOW) < parse_time("today", NOW)
    with pytest.raises(QueryError):
        parse_time("soon", NOW)
    assert parse_seq_range("5") == (5, 5) and parse_seq_range("..9") == (0, 9)
    with pytest.raises(QueryError):
        parse_seq_range("a..b")


def test_missing_directory_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert audit_main(["--dir", str(tmp_path / "none"), "search"]) == 2
    assert "no audit log" in capsys.readouterr().err


SECRET_ENV_VALUE = "s3cr3t-value-from-env-7781"
SEEDED = {
    "email": "jane.doe@example.org",
    "card": "4111 1111 1111 1111",
    "iban": "DE89370400440532013000",
    "phone": "+44 20 7946 0958",
    "github": "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8",
    "password": "hunter2-correct-horse",
    "env_secret": SECRET_ENV_VALUE,
}


def test_masking_keeps_every_seeded_value_out_of_the_files(tmp_path: Path, schemas: Any) -> None:
    policy = compile_doc(
        schemas, base_adl(tools=[{"name": "send", "description": "d", "parameters": {"type": "object"}}])
    )
    arguments = {
        "to": f"Please mail {SEEDED['email']} today",
        "payment": {"card": SEEDED["card"], "iban": SEEDED["iban"]},
        "notes": [f"call {SEEDED['phone']}", SEEDED["github"]],
        "password": SEEDED["password"],
        "body": f"token={SEEDED['env_secret']}",
    }
    masker = Masker(secrets=[SECRET_ENV_VALUE])
    directory = tmp_path / "audit"
    action = ToolCall("send", arguments)
    with AuditWriter(directory, tmp_path / "k.pem") as writer:
        writer.append(records.DECISION, decision_payload(policy, action, decide(policy, action), masker))
        adl_doc = {"provider": {"name": "Acme", "contact": {"email": "ops@acme.example"}}, "system_prompt": "be nice"}
        masked_doc = masker.mask(adl_doc, always=("/provider/contact", "/system_prompt"))
        writer.append(records.LAUNCH, {"document": masked_doc.value})
    blob = b"".join(p.read_bytes() for p in directory.rglob("*") if p.is_file())
    for value in [*SEEDED.values(), "ops@acme.example", "be nice"]:
        assert value.encode() not in blob, value
    record = next(
        r
        for r in map(json.loads, (directory / "audit-0000000000000001.jsonl").read_text().splitlines())
        if r["intent"] == "adl.enforcer.decision"
    )
    payload = record["payload"]
    assert payload["args_digest"] == "sha256:" + hashlib.sha256(records.canonical(arguments)).hexdigest()
    assert set(payload["masked"]) == {
        "/to",
        "/payment/card",
        "/payment/iban",
        "/notes/0",
        "/notes/1",
        "/password",
        "/body",
    }
    assert payload["args"]["to"] == "Please mail [masked:email] today"


_LEAF_TEXT = st.sampled_from(
    [
        "",
        "src/app.py",
        "ops@acme.example",
        "+44 20 7946 0958",
        SEEDED["card"],
        SEEDED["github"],
        SECRET_ENV_VALUE,
        "https://u:pw@host/x",
        "a" * 40,
    ]
) | st.text(max_size=12)
_MEMBER = st.sampled_from(["path", "password", "api_key", "notes", "to", "x"]) | st.text(max_size=6)
_JSON = st.recursive(
    _LEAF_TEXT | st.integers(-(2**63), 2**64 - 1) | st.booleans() | st.none(),  # orjson.loads gives no wider int
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_MEMBER, children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=_JSON, always=st.lists(st.sampled_from(["/password", "/notes", "/notes/0", "/x/path", "/nothing"])))
def test_masking_masks_exactly_the_leaves_each_leaf_check_names(value: Any, always: list[str]) -> None:
    """Masker.mask walks the value itself (it is on the Check path); it must agree leaf for leaf with
    the shared walk (iter_strings and member_name) and the per-leaf rule."""
    masker = Masker(secrets=[SECRET_ENV_VALUE])
    forced = {p for p in always if _resolves(value, p)}
    forced = {p for p in forced if not any(_under(p, f) and p != f for f in forced)}
    expected = {pointer(*path): masker._mask_text(member_name(path), text) for path, text in iter_strings(value)}
    expected = {
        ptr: text for ptr, text in expected.items() if text is not None and not any(_under(ptr, f) for f in forced)
    }
    expected.update(dict.fromkeys(forced, "[masked:secret]"))
    masked = masker.mask(value, always=always)
    assert masker.mask(value, always=always, pii=scan_leaves(value)) == masked  # PII searched for by the caller
    assert masked.pointers == tuple(sorted(expected))
    assert masked.digest == "sha256:" + hashlib.sha256(records.canonical(value)).hexdigest()
    for ptr, text in expected.items():
        assert _at(masked.value, ptr) == text


def _resolves(value: Any, ptr: str) -> bool:
    try:
        _at(value, ptr)
    except (KeyError, IndexError, TypeError, ValueError):
        return False
    return True


def _under(ptr: str, prefix: str) -> bool:
    return ptr == prefix or ptr.startswith(prefix + "/")


def _at(value: Any, ptr: str) -> Any:
    for token in ptr.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        value = value[int(token)] if isinstance(value, list) else value[token]
    return value


def test_session_evidence_validates_and_verifies(tmp_path: Path, spec: Path) -> None:
    key = load_or_create(tmp_path / "k.pem")
    evidence = build_evidence(
        governor="did:web:enforcer.example",
        agent_id="urn:adl:agent:acme:reader:1.0.0",
        passport_digest="sha256:" + "0" * 64,
        session="session-0001",
        tier="R3",
        start="2026-11-21T12:00:00.000000001Z",
        end="2026-11-21T12:00:05Z",
        iat="2026-11-21T12:00:05Z",
        limits={"max_memory_mb": 256},
        events=[
            EvidenceEvent("on_deny", "continue", "2026-11-21T12:00:01Z", {"rule": "fs.not_allowed"}),
            EvidenceEvent("on_timeout", "halt", "2026-11-21T12:00:05Z"),
        ],
        outcome="halted",
        key=key,
    )
    schema_path = spec / "agent-definition-language__specification/core/0.3.0/schema-enforcement-record.json"
    schema = json.loads(schema_path.read_text())
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(evidence)
    assert evidence_problem(evidence, key.public_key()) is None
    evidence["events"][0]["detail"] = {"rule": "rewritten"}
    assert evidence_problem(evidence, key.public_key()) == "signature does not verify"


def test_a_reader_that_goes_away_is_not_an_error(tmp_path: Path) -> None:
    """`adl-audit search | head -1`: the broken pipe ends the search quietly with exit 0. The log
    prints far more than a pipe holds, so the writer is still writing when the reader leaves."""
    import subprocess
    import sys

    directory = tmp_path / "audit"
    with AuditWriter(directory, tmp_path / "k.pem") as writer:
        for i in range(3000):
            writer.append(records.DECISION, {"agent": "urn:adl:agent:acme:reader:1.0.0", "decision": "allow", "n": i})
    proc = subprocess.Popen(
        [sys.executable, "-m", "enforcer.cli.audit", "--dir", str(directory), "search", "-n", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.readline()
    proc.stdout.close()
    assert proc.wait(timeout=30) == 0
    assert proc.stderr.read() == b""
