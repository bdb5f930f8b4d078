"""The payloads of a session's audit records (audit/events.py), built without a kernel or root."""

from __future__ import annotations

from typing import Any

import pytest

from enforcer.audit import Masker, events
from enforcer.audit.masking import SECRET_MASK

from ..helpers.documents import base_adl, compile_doc

SECRET = "s3cr3t-value-handed-to-the-agent"


@pytest.fixture(scope="module")
def policy(schemas: Any) -> Any:
    return compile_doc(schemas, base_adl(id="did:web:agents.example:coder"))


def test_refusal_names_the_policy_when_there_is_one(policy: Any) -> None:
    with_policy = events.refusal_payload(policy, "no network layer on this host", ["agent", "--fast"])
    assert with_policy == {
        "decision": "deny",
        "reason": "refused",
        "refusal": "no network layer on this host",
        "argv": ["agent", "--fast"],
        "agent": "did:web:agents.example:coder",
        "policy_digest": policy.digest,
    }
    # Refused before any policy was loaded: no agent to name.
    without = events.refusal_payload(None, "documents unreadable", ["agent"])
    assert "agent" not in without and "policy_digest" not in without
    assert without["decision"] == "deny" and without["refusal"] == "documents unreadable"


def test_refusal_masks_credentials_in_argv(policy: Any) -> None:
    payload = events.refusal_payload(policy, "refused", ["agent", "https://bot:hunter2@git.example/repo"])
    assert payload["argv"][0] == "agent"
    assert "hunter2" not in str(payload["argv"])


def test_launch_payload_masks_the_secrets_handed_over(policy: Any) -> None:
    payload = events.launch_payload(
        policy,
        Masker([SECRET]),
        argv=["agent", SECRET],
        command="/usr/bin/agent",
        layers=[{"name": "filesystem"}],
        accepted_unenforced=["network"],
        baseline_path="/etc/baseline.yaml",
        baseline_digest="sha256:00",
        env_passed={"PATH": "/bin", "HOME": "/home/a"},
        env_dropped=["AWS_SECRET_ACCESS_KEY"],
        uid=1000,
        gid=1001,
    )
    assert payload["argv"] == ["agent", SECRET_MASK]
    assert SECRET not in str(payload)
    assert payload["env_passed"] == ["HOME", "PATH"]  # names only, sorted
    assert payload["baseline"] == {"path": "/etc/baseline.yaml", "digest": "sha256:00"}
    assert (payload["agent"], payload["decision"], payload["policy_digest"]) == (
        "did:web:agents.example:coder",
        "allow",
        policy.digest,
    )
    assert (payload["uid"], payload["gid"], payload["accepted_unenforced"]) == (1000, 1001, ["network"])


def test_guard_refusal_is_a_deny_decision(policy: Any) -> None:
    refusal = {"syscall": "openat", "path": "/w/.aws/credentials", "pid": 42, "pattern": "**/.aws/credentials"}
    payload = events.guard_refusal_payload(policy, refusal)
    assert payload["decision"] == "deny" and payload["rules"] == ["fs.denied"]
    assert (payload["syscall"], payload["path"], payload["pid"]) == ("openat", "/w/.aws/credentials", 42)
    assert "'**/.aws/credentials'" in payload["reasons"][0]["text"]


def test_exit_payload_counts_unrecorded_creations_and_drops_the_top_list(policy: Any) -> None:
    denials = {"available": True, "seccomp": 3, "top": [{"syscall": "ptrace", "count": 3}]}
    payload = events.exit_payload(
        policy,
        reason="timeout",
        exit_code=137,
        signal=9,
        duration_s=1.2345,
        pid=77,
        creations_refused=5,
        creations_recorded=2,
        kernel_denials=denials,
    )
    assert payload["duration_ms"] == 1234
    assert payload["creations_refused_unrecorded"] == 3
    assert payload["kernel_denials"] == {"available": True, "seccomp": 3}
    assert "network" not in payload and "cleanup_error" not in payload
    with_network = events.exit_payload(
        policy,
        reason="exit",
        exit_code=0,
        signal=None,
        duration_s=0.0,
        pid=1,
        creations_refused=0,
        creations_recorded=0,
        kernel_denials={},
        network={"connections": 2},
        cleanup_error="cgroup busy",
    )
    assert with_network["network"] == {"connections": 2} and with_network["cleanup_error"] == "cgroup busy"


def test_exit_priority() -> None:
    assert events.exit_priority("exit") == "normal"
    for reason in ("timeout", "oom", "pids_limit", "signal"):
        assert events.exit_priority(reason) == "high"


def test_caller_and_evidence_payloads(policy: Any) -> None:
    assert events.caller_fields(1000, "/home/a") == {"caller_uid": 1000, "cwd": "/home/a"}
    evidence = {"adl_enforcement_record": "1.0"}
    assert events.evidence_payload(policy, evidence) == {"agent": "did:web:agents.example:coder", "evidence": evidence}
