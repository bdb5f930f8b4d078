"""The API and the sandbox agree: what decide() denies, adl-exec refuses or masks, and an AAIF
required capability this enforcer lacks makes a regulated agent refused, with an audit record."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from enforcer.documents import read_document, schema_set
from enforcer.policy import CompileOptions, FileAccess, compile_policy, decide
from tests.helpers.sandbox import Sandbox


def test_a_denied_directory_is_denied_by_decide_and_masked_in_the_sandbox(sandbox: Sandbox) -> None:
    secrets = sandbox.ws / "processing" / "job-1" / "secrets"
    secrets.mkdir(parents=True)
    (secrets / "key.txt").write_text("SECRET-IN-DIRECTORY\n")
    (secrets.parent / "public.txt").write_text("public result\n")
    fs = dict(sandbox.permissions["filesystem"])
    fs["denied_paths"] = [*fs["denied_paths"], f"{sandbox.ws}/processing/**/secrets"]
    path = sandbox.policy(permissions={"filesystem": fs})
    policy = compile_policy(read_document(path, "adl"), None, schema_set(), datetime.now(UTC), CompileOptions())

    inside, beside = str(secrets / "key.txt"), str(secrets.parent / "public.txt")
    assert decide(policy, FileAccess(inside)).verdict == "DENY"
    assert decide(policy, FileAccess(beside)).verdict == "ALLOW"
    r = sandbox.run("cat", inside, policy=path)
    assert r.code != 0 and "SECRET-IN-DIRECTORY" not in r.out
    r = sandbox.run("cat", beside, policy=path)  # control: the directory beside it stays readable
    assert r.code == 0 and "public result" in r.out, r.err


def test_a_regulated_agent_needing_an_unprovided_capability_is_refused_and_audited(sandbox: Sandbox) -> None:
    aaif = sandbox.root / "agent.aaif.json"
    document = {
        "sc_standard": "SC-006",
        "sc_version": "3.2.0",
        "agent": {
            "name": "Sandboxed",
            "goal": "g",
            "compliance": {"safety_level": "regulated"},
            "required_capabilities": ["compliance.audit_log", "state.checkpoint"],
        },
    }
    aaif.write_text(json.dumps(document))
    r = sandbox.run("ls", str(sandbox.ws), args=("--aaif", str(aaif)))
    assert r.code == 125 and "ENF-2010" in r.err and "state.checkpoint" in r.err
    assert "refused" in r.kinds() and "ENF-2010" in json.dumps(r.record("refused"))
    document["agent"]["required_capabilities"] = ["compliance.audit_log"]  # control: provided
    aaif.write_text(json.dumps(document))
    r = sandbox.run("ls", str(sandbox.ws), args=("--aaif", str(aaif)))
    assert r.code == 0 and "notes.txt" in r.out, r.err
