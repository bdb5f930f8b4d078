"""adl-approve end to end: a real daemon, a runtime waiting on a real pending Check, the CLI deciding it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from enforcer.client import Client, Result
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def approve_cli(daemon: RunningDaemon, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "enforcer.cli.approve", "--admin", str(daemon.admin), *args]
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env)


def wait_in_thread(client: Client, pending: Result) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}
    waiter = threading.Thread(target=lambda: out.update(final=client.wait_approval(pending, timeout_s=20)))
    waiter.start()
    return waiter, out


def test_list_show_approve_and_reject_real_pending_checks(daemon: RunningDaemon) -> None:
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    try:
        none = approve_cli(daemon, "list")
        assert none.returncode == 1 and "no approvals pending" in none.stdout

        asked = client.check_tool("delete_note", {"name": "ops@acme.example"})
        assert asked.decision == "ASK" and asked.approval_id
        listed = approve_cli(daemon, "--json", "list")
        assert listed.returncode == 0, listed.stderr
        pending = json.loads(listed.stdout)["pending"]
        assert [p["approval_id"] for p in pending] == [asked.approval_id]
        assert pending[0]["tool"] == "delete_note" and pending[0]["agent"] == "Sandboxed"
        # the arguments are shown masked, as in the audit log
        assert "ops@acme.example" not in listed.stdout and "masked" in listed.stdout

        shown = approve_cli(daemon, "show", asked.approval_id)
        assert shown.returncode == 0, shown.stderr
        assert "delete_note" in shown.stdout and "tool.requires_confirmation" in shown.stdout
        assert "ops@acme.example" not in shown.stdout

        waiter, out = wait_in_thread(client, asked)
        approved = approve_cli(daemon, "--json", "approve", asked.approval_id, "--as", "alice", "--note", "checked")
        assert approved.returncode == 0, approved.stderr
        answer = json.loads(approved.stdout)
        assert answer["outcome"] == "approved" and answer["approver"].startswith("alice (unix user ")
        waiter.join(20)
        final = out["final"]
        assert final.decision == "ALLOW" and "alice" in final.reasons[0]["text"]
        record = next(r for r in daemon.records() if r["seq"] == answer["audit_seq"])
        assert record["payload"]["outcome"] == "approved" and record["payload"]["note"] == "checked"
        assert record["payload"]["approver"] == answer["approver"]

        # deciding it again is refused, not silently accepted
        again = approve_cli(daemon, "reject", asked.approval_id)
        assert again.returncode == 3 and "already approved" in again.stderr and not again.stdout

        second = client.check_tool("delete_note", {"name": "b"})
        waiter, out = wait_in_thread(client, second)
        rejected = approve_cli(daemon, "reject", second.approval_id, "--note", "not today")
        assert rejected.returncode == 0 and "rejected by" in rejected.stdout, rejected.stderr
        waiter.join(20)
        assert out["final"].decision == "DENY" and out["final"].reasons[0]["rule"] == "hitl.rejected"
        record = [r for r in daemon.records() if r["intent"].endswith(".approval")][-1]
        assert record["payload"]["outcome"] == "rejected" and record["payload"]["note"] == "not today"
        assert record["payload"]["approver"]  # the login name of whoever ran the CLI

        missing = approve_cli(daemon, "--json", "approve", "apr-doesnotexist")
        assert missing.returncode == 1 and json.loads(missing.stdout)["error"] == "not_found"
    finally:
        client.close()


def test_watch_prints_approvals_as_they_open_and_close(daemon: RunningDaemon) -> None:
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    argv = [sys.executable, "-m", "enforcer.cli.approve", "--admin", str(daemon.admin), "--json", "watch"]
    watcher = subprocess.Popen(
        [*argv, "--interval", "0.1", "--timeout", "20"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        time.sleep(0.5)
        asked = client.check_tool("delete_note", {"name": "w"})
        assert watcher.stdout is not None
        opened = json.loads(watcher.stdout.readline())
        assert opened["event"] == "pending" and opened["approval_id"] == asked.approval_id
        assert approve_cli(daemon, "reject", asked.approval_id).returncode == 0
        closed = json.loads(watcher.stdout.readline())
        assert closed == {
            "event": "closed",
            "approval_id": asked.approval_id,
            "agent": "Sandboxed",
            "tool": "delete_note",
        }
    finally:
        watcher.kill()
        watcher.wait(5)
        client.close()


def test_unreachable_admin_socket_is_a_clear_error(tmp_path: Any) -> None:
    argv = [sys.executable, "-m", "enforcer.cli.approve", "--admin", str(tmp_path / "none.sock"), "--json", "list"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and json.loads(done.stdout)["error"] == "unavailable"


def test_an_approval_whose_waiting_client_went_away_is_cancelled_not_approvable(daemon: RunningDaemon) -> None:
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    try:
        asked = client.check_tool("delete_note", {"name": "gone"})
        assert asked.decision == "ASK"
        stub = daemon.enforcer()
        waiting = stub.WaitApproval.future(pb.WaitApprovalRequest(approval_id=asked.approval_id, wait_ms=20_000))
        time.sleep(0.5)
        assert approve_cli(daemon, "show", asked.approval_id).returncode == 0  # pending while someone waits
        waiting.cancel()  # the runtime went away
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and approve_cli(daemon, "show", asked.approval_id).returncode == 0:
            time.sleep(0.2)
        late = approve_cli(daemon, "approve", asked.approval_id, "--note", "too late")
        assert late.returncode == 3 and "already rejected" in late.stderr
        record = [r for r in daemon.records() if r["intent"].endswith(".approval")][-1]["payload"]
        assert record["outcome"] == "rejected" and record["approver"] == "adl-enforcerd"
        assert record["note"] == "cancelled: the waiting client went away"
        # a wait that simply ends (wait_ms elapsed, client still there) cancels nothing
        second = client.check_tool("delete_note", {"name": "stays"})
        answer = stub.WaitApproval(pb.WaitApprovalRequest(approval_id=second.approval_id, wait_ms=300))
        assert answer.decision == pb.ASK and approve_cli(daemon, "show", second.approval_id).returncode == 0
    finally:
        client.close()
