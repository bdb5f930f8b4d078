"""adl-claude-hook fed Claude Code's PreToolUse events, answered by a real daemon."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon, daemon  # noqa: F401 (fixture)


def _permissions(root: Path, allow_shell: bool) -> dict[str, Any]:
    return {
        "filesystem": {
            "allowed_paths": [
                {"path": f"{root}/project/**", "access": "read_write"},
                {"path": f"{root}/reference/**", "access": "read"},
            ],
            "denied_paths": [f"{root}/project/.env"],
        },
        "network": {"allowed_hosts": ["api.example.com"], "allowed_ports": [443], "allowed_protocols": ["https"]},
        "execution": {"allowed_commands": ["python3"], "allow_shell": allow_shell},
    }


@pytest.fixture
def coder(daemon: RunningDaemon) -> RunningDaemon:  # noqa: F811
    daemon.write_adl("coder", "Coder", _permissions(daemon.root, allow_shell=False))
    daemon.write_adl("shell-coder", "Shell Coder", _permissions(daemon.root, allow_shell=True))
    daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())
    return daemon


def _event(tool: str, tool_input: dict[str, Any], cwd: str = "/") -> dict[str, Any]:
    """The PreToolUse event as Claude Code documents it."""
    return {
        "session_id": "abc123",
        "transcript_path": "/tmp/transcript.jsonl",
        "cwd": cwd,
        "permission_mode": "default",
        "hook_event_name": "PreToolUse",
        "tool_name": tool,
        "tool_input": tool_input,
        "tool_use_id": "toolu_01ABC123",
    }


def _hook(d: RunningDaemon, stdin: str, agent: str = "Coder", *options: str) -> tuple[int, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "enforcer.integrations.claude_code", "--agent", agent, "--socket", str(d.api), *options],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, output.get("hookSpecificOutput", {}), proc.stderr


def test_each_mapped_tool_is_answered_as_the_policy_decides(coder: RunningDaemon) -> None:
    root = coder.root
    cases: list[tuple[str, str, dict[str, Any], str, str]] = [
        # agent, tool, tool_input, expected decision, the rule that decides
        ("Coder", "Bash", {"command": "ls -la", "description": "list"}, "deny", "exec.shell"),
        ("Shell Coder", "Bash", {"command": "ls -la"}, "allow", "exec.shell_allowed"),
        ("Coder", "Read", {"file_path": f"{root}/project/a.py"}, "allow", "fs."),
        ("Coder", "Read", {"file_path": "a.py"}, "allow", "fs."),  # relative: joined to cwd
        ("Coder", "Read", {"file_path": "/etc/shadow"}, "deny", "fs."),
        ("Coder", "Read", {"file_path": f"{root}/project/.env"}, "deny", "fs."),
        ("Coder", "Write", {"file_path": f"{root}/project/out.py", "content": "x = 1\n"}, "allow", "fs."),
        ("Coder", "Write", {"file_path": f"{root}/reference/doc.md", "content": "x"}, "deny", "fs."),
        ("Coder", "Edit", {"file_path": f"{root}/project/a.py", "old_string": "a", "new_string": "b"}, "allow", "fs."),
        (
            "Coder",
            "Edit",
            {"file_path": f"{root}/reference/doc.md", "old_string": "a", "new_string": "b"},
            "deny",
            "fs.",
        ),
        ("Coder", "WebFetch", {"url": "https://api.example.com/v1/x", "prompt": "summarise"}, "allow", "net."),
        ("Coder", "WebFetch", {"url": "https://evil.example.net/", "prompt": "summarise"}, "deny", "net."),
        ("Coder", "WebFetch", {"url": "http://api.example.com/", "prompt": "summarise"}, "deny", "net."),
        ("Coder", "WebFetch", {"url": "file:///etc/passwd", "prompt": "x"}, "deny", "cannot map"),
        # Browsers read these as evil.example.net; Python's urlsplit would name api.example.com.
        (
            "Coder",
            "WebFetch",
            {"url": "https://evil.example.net\\@api.example.com/", "prompt": "x"},
            "deny",
            "cannot map",
        ),
        (
            "Coder",
            "WebFetch",
            {"url": "https://evil.example.net\tapi.example.com/", "prompt": "x"},
            "deny",
            "cannot map",
        ),
        ("Coder", "WebFetch", {"url": "https://x@api.example.com/", "prompt": "x"}, "deny", "cannot map"),
        # A path that leaves the project by '..' is decided for where it leads (reference is read-only).
        ("Coder", "Write", {"file_path": f"{root}/project/../reference/doc.md", "content": "x"}, "deny", "fs."),
        ("Coder", "Write", {"file_path": "../reference/doc.md", "content": "x"}, "deny", "fs."),
        ("Coder", "mcp__notes__read_note", {"name": "todo"}, "allow", "tool."),
        ("Coder", "mcp__notes__read_note", {"name": 7}, "deny", "tool.args_invalid"),
        ("Coder", "mcp__notes__shell", {"command": "id"}, "deny", "tool.undeclared"),
        ("Coder", "Glob", {"pattern": "**/*.py"}, "deny", "tool.undeclared"),
    ]
    seen_rules = []
    for agent, tool, tool_input, expected, rule in cases:
        code, out, stderr = _hook(coder, json.dumps(_event(tool, tool_input, cwd=f"{root}/project")), agent)
        label = f"{agent} {tool} {tool_input}"
        assert out.get("hookEventName") == "PreToolUse", label
        assert out["permissionDecision"] == expected, (label, out, stderr)
        assert rule in out["permissionDecisionReason"], (label, out)
        assert code == (0 if expected == "allow" else 2), (label, code)
        if expected == "deny":
            assert rule in stderr, label  # exit 2: Claude Code shows stderr to the model
        seen_rules.append(out["permissionDecisionReason"])
    # Every answer that reached the daemon is in its audit log.
    decisions = [r for r in coder.records() if r["intent"].endswith(".decision")]
    unmapped = [c for c in cases if c[4] == "cannot map"]
    assert len(decisions) == len(cases) - len(unmapped)  # those were refused before any Check
    assert {r["payload"]["request_id"] for r in decisions} == {"toolu_01ABC123"}


def test_ask_waits_for_the_daemons_approval_or_defers_to_claude_code(coder: RunningDaemon) -> None:
    event = json.dumps(_event("mcp__notes__delete_note", {"name": "old"}))
    code, out, _ = _hook(coder, event, "Coder", "--ask", "prompt")
    assert (code, out["permissionDecision"]) == (0, "ask")

    admin = coder.admin_stub()
    approved: list[str] = []

    def approve() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not approved:
            for pending in admin.ListPending(pb.ListPendingRequest(agent="Coder")).pending:
                if pending.tool == "delete_note" and pending.approval_id not in approved:
                    admin.Approve(pb.ApprovalDecision(approval_id=pending.approval_id, approver="alice"))
                    approved.append(pending.approval_id)
            time.sleep(0.05)

    # The approval from --ask prompt is still pending: reject it, so the approver sees only the next one.
    for pending in admin.ListPending(pb.ListPendingRequest(agent="Coder")).pending:
        admin.Reject(pb.ApprovalDecision(approval_id=pending.approval_id, approver="test"))
    approver = threading.Thread(target=approve)
    approver.start()
    code, out, _ = _hook(coder, event, "Coder", "--approval-wait", "20")
    approver.join(25)
    assert approved and (code, out["permissionDecision"]) == (0, "allow"), out

    started = time.monotonic()
    code, out, stderr = _hook(coder, event, "Coder", "--approval-wait", "1")
    assert (code, out["permissionDecision"]) == (2, "deny") and "ASK" in stderr
    assert time.monotonic() - started < 15


def test_unreadable_events_and_an_unreachable_daemon_block(coder: RunningDaemon) -> None:
    unreadable = (
        "",
        "not json",
        "[1, 2]",
        json.dumps({**_event("Read", {}), "tool_input": {"file_path": 3}}),
        '{"tool_input": ' + "[" * 100_000,  # deeper than the JSON parser recurses
        json.dumps({**_event("Read", {"file_path": "/x"}), "tool_use_id": 7, "cwd": ["not", "a", "path"]}),
    )
    for stdin in unreadable:
        code, out, stderr = _hook(coder, stdin)
        assert (code, out["permissionDecision"]) == (2, "deny"), stdin
        assert stderr
    other_event = {**_event("Read", {"file_path": "/x"}), "hook_event_name": "PostToolUse"}
    code, out, _ = _hook(coder, json.dumps(other_event))
    assert (code, out["permissionDecision"]) == (2, "deny")
    coder.stop()
    code, out, stderr = _hook(coder, json.dumps(_event("Read", {"file_path": f"{coder.root}/project/a.py"})))
    assert (code, out["permissionDecision"]) == (2, "deny") and "client.error" in stderr


def test_a_hook_stopped_while_it_waits_blocks_the_tool(coder: RunningDaemon) -> None:
    """Claude Code stops a hook at its timeout; any exit but 2 would let the tool run."""
    event = json.dumps(_event("mcp__notes__delete_note", {"name": "old"}))
    argv = [sys.executable, "-m", "enforcer.integrations.claude_code", "--agent", "Coder", "--socket", str(coder.api)]
    proc = subprocess.Popen([*argv, "--approval-wait", "30"], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    proc.stdin.write(event)
    proc.stdin.close()
    admin = coder.admin_stub()
    deadline = time.monotonic() + 20
    while not admin.ListPending(pb.ListPendingRequest(agent="Coder")).pending:  # it waits for the approval now
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.05)
    proc.terminate()
    assert proc.wait(timeout=10) == 2
    assert proc.stderr is not None and "refused" in proc.stderr.read()
