"""adl-enforcerd end to end: a real daemon on temporary sockets, real clients, the real audit log."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from enforcer.audit.verify import verify_directory
from enforcer.client import AsyncClient, Client
from enforcer.sandbox import cgroups
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon, tool_request

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def by_decision_id(d: RunningDaemon, decision_id: str) -> dict:
    return next(r for r in d.records() if r["payload"].get("decision_id") == decision_id)


def test_check_allow_deny_ask_with_reasons_and_audit_receipts(daemon: RunningDaemon) -> None:
    stub = daemon.enforcer()
    allow = stub.Check(tool_request("Sandboxed", "read_note", {"name": "a", "count": 2}, request_id="r-1"))
    assert allow.decision == pb.ALLOW and allow.reasons[0].rule == "tool.allowed"
    assert allow.request_id == "r-1" and allow.agent == "Sandboxed" and allow.policy_digest
    record = by_decision_id(daemon, allow.decision_id)
    assert record["seq"] == allow.receipt.seq and record["hash"] == allow.receipt.hash  # audited before answered
    assert record["payload"]["decision"] == "allow" and record["payload"]["request_id"] == "r-1"

    wrong_type = stub.Check(tool_request("Sandboxed", "read_note", {"name": "a", "count": 2.5}))
    assert wrong_type.decision == pb.DENY and wrong_type.reasons[0].rule == "tool.args_invalid"
    assert wrong_type.reasons[0].pointer == "/tools/0/parameters"  # integers stay integers end to end
    undeclared = stub.Check(tool_request("Sandboxed", "rm_rf", {}))
    assert undeclared.decision == pb.DENY and "not declared" in undeclared.reasons[0].text
    ask = stub.Check(tool_request("Sandboxed", "delete_note", {"name": "a"}))
    assert ask.decision == pb.ASK and ask.approval_id and ask.reasons[0].rule == "tool.requires_confirmation"
    assert ask.approval_expires_unix_ms > time.time() * 1000 + 200_000  # the 300 s default

    dry = stub.Check(tool_request("Sandboxed", "delete_note", {"name": "a"}, mode=pb.DRY_RUN))
    assert dry.decision == pb.ASK and not dry.approval_id  # a dry run opens no approval
    assert by_decision_id(daemon, dry.decision_id)["payload"]["mode"] == "dry_run"

    batch = stub.CheckBatch(
        pb.CheckBatchRequest(
            requests=[tool_request("Sandboxed", "read_note", {"name": "x"}), tool_request("Sandboxed", "nope", {})]
        )
    )
    assert [r.decision for r in batch.responses] == [pb.ALLOW, pb.DENY]

    # arguments that are a string, not an object: denied, recorded, and masked like any other argument
    bare = stub.Check(
        pb.CheckRequest(agent="Sandboxed", tool=pb.ToolCall(name="read_note", arguments_json='"ops@acme.example"'))
    )
    assert bare.decision == pb.DENY and bare.reasons[0].rule == "tool.args_invalid"
    bare_record = by_decision_id(daemon, bare.decision_id)
    assert bare_record["payload"]["args"] == "[masked:email]" and bare_record["payload"]["masked"] == [""]

    file_deny = stub.Check(pb.CheckRequest(agent="Sandboxed", file=pb.FileAccess(path="/etc/shadow", mode="read")))
    assert file_deny.decision == pb.DENY
    explain = stub.Explain(tool_request("Sandboxed", "pay", {"amount": 1}))
    assert explain.decision.decision == pb.ALLOW and explain.decision.mode == pb.DRY_RUN
    assert json.loads(explain.policy_json)["agent"]["name"] == "Sandboxed"
    # Check and CheckBatch above came from the inline loop, not the sync server's fallback handlers
    assert "served on the inline loop" in daemon.log.read_text()


def test_approval_flow_approve_reject_and_expiry(daemon: RunningDaemon) -> None:
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    admin = daemon.admin_stub()
    asked = client.check_tool("delete_note", {"name": "old"})
    assert asked.decision == "ASK"
    pending = admin.ListPending(pb.ListPendingRequest()).pending
    assert [p.approval_id for p in pending] == [asked.approval_id] and pending[0].tool == "delete_note"

    result: dict[str, object] = {}
    waiter = threading.Thread(target=lambda: result.update(final=client.wait_approval(asked, timeout_s=10)))
    waiter.start()
    time.sleep(0.2)
    with pytest.raises(grpc.RpcError) as no_approver:
        admin.Approve(pb.ApprovalDecision(approval_id=asked.approval_id))
    assert no_approver.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    approved = admin.Approve(pb.ApprovalDecision(approval_id=asked.approval_id, approver="alice", note="ok"))
    waiter.join(10)
    final = result["final"]
    assert final.decision == "ALLOW" and "alice" in final.reasons[0]["text"]  # type: ignore[attr-defined]
    record = next(r for r in daemon.records() if r["seq"] == approved.receipt.seq)
    assert record["payload"]["approver"] == "alice" and record["payload"]["outcome"] == "approved"
    with pytest.raises(grpc.RpcError) as twice:
        admin.Reject(pb.ApprovalDecision(approval_id=asked.approval_id, approver="bob"))
    assert twice.value.code() == grpc.StatusCode.FAILED_PRECONDITION

    second = client.check_tool("delete_note", {"name": "other"})
    admin.Reject(pb.ApprovalDecision(approval_id=second.approval_id, approver="bob", note="no"))
    rejected = client.wait_approval(second, timeout_s=5)
    assert rejected.decision == "DENY" and rejected.reasons[0]["rule"] == "hitl.rejected"

    fast = Client(f"unix:{daemon.api}", agent="Fast")
    small = fast.check_tool("pay", {"amount": 5})
    assert small.decision == "ALLOW"
    big = fast.check_tool("pay", {"amount": 500})
    assert big.decision == "ASK" and big.obligations["approval_timeout_s"] == 1
    started = time.monotonic()
    expired = fast.wait_approval(big, timeout_s=10)
    assert expired.decision == "DENY" and expired.reasons[0]["rule"] == "hitl.expired"
    assert time.monotonic() - started < 5
    outcomes = [r["payload"].get("outcome") for r in daemon.records() if r["intent"].endswith(".approval")]
    assert outcomes == ["approved", "rejected", "expired"]
    client.close()
    fast.close()


def test_reload_under_concurrent_checks_never_fails_and_keeps_the_last_good_version(daemon: RunningDaemon) -> None:
    stop = threading.Event()
    failures: list[str] = []
    counts = [0] * 6

    def hammer(i: int) -> None:
        stub = daemon.enforcer()
        while not stop.is_set():
            try:
                reply = stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"}), timeout=5)
                if reply.decision != pb.ALLOW:
                    failures.append(f"decision {reply.decision}: {reply.reasons}")
            except grpc.RpcError as exc:
                failures.append(f"{exc.code()}: {exc.details()}")
            counts[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(len(counts))]
    for t in threads:
        t.start()
    admin = daemon.admin_stub()
    try:
        for round_ in range(10):
            daemon.write_adl("extra", f"Extra {round_}", {})
            if round_ % 2:
                daemon.proc.send_signal(1)  # SIGHUP  # type: ignore[union-attr]
                time.sleep(0.1)
            else:
                reply = admin.ReloadPolicies(pb.ReloadRequest())
                assert not reply.problems
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert failures == [] and sum(counts) > 100, (failures[:3], counts)

    generation = admin.ReloadPolicies(pb.ReloadRequest()).generation
    (daemon.policies / "sandboxed.adl.json").write_text('{"adl_spec": "0.3.0", "name": "Sandboxed"')  # broken
    reply = admin.ReloadPolicies(pb.ReloadRequest())
    assert reply.generation == generation + 1
    assert reply.problems and "previous version kept" in reply.problems[0].detail
    still = daemon.enforcer().Check(tool_request("Sandboxed", "read_note", {"name": "n"}))
    assert still.decision == pb.ALLOW
    status = daemon.enforcer().Status(pb.StatusRequest())
    assert status.problems and status.serving
    problems = [r for r in daemon.records() if r["intent"].endswith(".policy.load") and r["payload"].get("problem")]
    assert problems and problems[-1]["payload"]["path"].endswith("sandboxed.adl.json")


def _concurrent_checks(daemon: RunningDaemon) -> None:
    """120 Checks at once, a few of them malformed: each answer carries its own decision and the
    receipt of its own record, and a bad request fails alone."""
    stub = daemon.enforcer()
    raw = daemon.channel().unary_unary("/enforcer.v1.Enforcer/Check")
    calls = []
    for i in range(120):
        if i % 40 == 7:
            calls.append(("bad", raw.future(b"\xff\xff not a protobuf", timeout=20)))
        elif i % 3:
            request = tool_request("Sandboxed", "read_note", {"name": "n"}, request_id=f"a-{i}")
            calls.append((f"a-{i}", stub.Check.future(request, timeout=20)))
        else:
            request = tool_request("Sandboxed", "rm_rf", {}, request_id=f"d-{i}")
            calls.append((f"d-{i}", stub.Check.future(request, timeout=20)))
    responses = {}
    for label, call in calls:
        if label == "bad":
            assert call.exception().code() == grpc.StatusCode.INVALID_ARGUMENT
            continue
        response = call.result()
        assert response.request_id == label
        assert response.decision == (pb.ALLOW if label.startswith("a-") else pb.DENY)
        responses[label] = response
    by_id = {r["payload"].get("decision_id"): r for r in daemon.records()}
    for label, response in responses.items():
        record = by_id[response.decision_id]
        assert record["payload"]["request_id"] == label
        assert (record["seq"], record["hash"]) == (response.receipt.seq, response.receipt.hash)
    assert len({r.receipt.seq for r in responses.values()}) == len(responses) == 117


def test_concurrent_checks_each_get_their_own_answer_and_record(daemon: RunningDaemon) -> None:
    """Checks that reach the daemon together are decided and recorded together (one write)."""
    _concurrent_checks(daemon)


def test_with_the_inline_loop_off_the_worker_threads_answer_the_same(daemon: RunningDaemon) -> None:
    daemon.stop()
    daemon.extra_env["ADL_ENFORCER_INLINE_CHECK"] = "false"
    daemon.start()
    assert "served by the gRPC worker threads (inline_check is off)" in daemon.log.read_text()
    _concurrent_checks(daemon)
    batch = daemon.enforcer().CheckBatch(
        pb.CheckBatchRequest(
            requests=[tool_request("Sandboxed", "read_note", {"name": "x"}), tool_request("Sandboxed", "nope", {})]
        )
    )
    assert [r.decision for r in batch.responses] == [pb.ALLOW, pb.DENY]


def test_an_inline_loop_that_fails_its_probe_leaves_check_to_the_worker_threads(daemon: RunningDaemon) -> None:
    daemon.stop()
    logged_before = len(daemon.log.read_bytes())
    daemon.program = [str(Path(__file__).parent.parent / "helpers" / "inline_broken.py")]
    daemon.start()
    log = daemon.log.read_bytes()[logged_before:].decode()
    assert "a probe call through the inline loop got" in log
    assert "served by the gRPC worker threads (slower)" in log and "served on the inline loop" not in log
    _concurrent_checks(daemon)


def test_health_says_serving_only_once_every_socket_listens(daemon: RunningDaemon) -> None:
    """A client that waits for SERVING on the API socket may go straight to the admin or launch
    socket; the API socket listens first and probes its inline loop, so health must wait. Here the
    loop holds every call, so the probe takes its whole 5 s deadline before the admin socket opens."""
    daemon.stop()
    assert not daemon.admin.exists()
    daemon.program = [str(Path(__file__).parent.parent / "helpers" / "inline_broken.py")]
    daemon.extra_env["ADL_TEST_INLINE"] = "hold"
    daemon.start(wait=False)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if daemon.api.exists():
            with grpc.insecure_channel(f"unix:{daemon.api}") as channel:
                try:
                    reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
                except grpc.RpcError:
                    reply = None
            if reply is not None and reply.status == health_pb2.HealthCheckResponse.SERVING:
                assert daemon.admin.exists() and daemon.launch.exists()
                assert "got DEADLINE_EXCEEDED" in daemon.log.read_text()  # the probe did hold it up
                _concurrent_checks(daemon)  # answered by the worker threads
                return
        time.sleep(0.001)
    raise AssertionError(f"never SERVING:\n{daemon.log.read_text()}")


def test_bad_input_gets_invalid_argument_and_the_daemon_keeps_serving(daemon: RunningDaemon) -> None:
    channel = daemon.channel()
    raw = channel.unary_unary("/enforcer.v1.Enforcer/Check")
    with pytest.raises(grpc.RpcError) as garbage:
        raw(b"\xff\xff\xff\xff\x0f not a protobuf", timeout=5)
    assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    big = tool_request("Sandboxed", "read_note", {"name": "x" * (2 << 20)})
    with pytest.raises(grpc.RpcError) as oversized:
        daemon.enforcer().Check(big, timeout=10)
    assert oversized.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "exceeds" in oversized.value.details()
    for request, needle in [
        (pb.CheckRequest(agent="Sandboxed"), "no action"),
        (pb.CheckRequest(agent="Sandboxed", tool=pb.ToolCall(name="read_note", arguments_json="{nope")), "not JSON"),
        (pb.CheckRequest(tool=pb.ToolCall(name="read_note")), "name the agent"),
        (pb.CheckRequest(agent="Sandboxed", network=pb.NetworkConnect(host="a.test", port=0)), "port"),
    ]:
        with pytest.raises(grpc.RpcError) as bad:
            daemon.enforcer().Check(request, timeout=5)
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT and needle in bad.value.details()
    with pytest.raises(grpc.RpcError) as unknown:
        daemon.enforcer().Check(tool_request("Nobody", "read_note", {}), timeout=5)
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    with pytest.raises(grpc.RpcError) as not_here:  # admin calls are not served on the API socket
        pb_admin = __import__("enforcer.v1.enforcer_pb2_grpc", fromlist=["AdminStub"]).AdminStub(daemon.channel())
        pb_admin.ReloadPolicies(pb.ReloadRequest(), timeout=5)
    assert not_here.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert daemon.enforcer().Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
    assert oct(daemon.api.stat().st_mode & 0o777) == "0o660" and oct(daemon.admin.stat().st_mode & 0o777) == "0o600"


def test_client_library_turns_every_failure_into_deny(daemon: RunningDaemon, tmp_path: Path) -> None:
    nowhere = Client(f"unix:{tmp_path}/missing.sock", agent="Sandboxed", deadline_s=0.5)
    down = nowhere.check_tool("read_note", {"name": "n"})
    assert down.decision == "DENY" and down.error and down.reasons[0]["rule"] == "client.error"
    unserialisable = Client(f"unix:{daemon.api}", agent="Sandboxed").check_tool("read_note", {"x": object()})
    assert unserialisable.decision == "DENY" and "not JSON" in str(unserialisable.error)

    import asyncio

    async def use_async() -> tuple[str, str]:
        async with AsyncClient(f"unix:{daemon.api}", agent="Sandboxed") as client:
            ok = await client.check_tool("read_note", {"name": "n"})
        async with AsyncClient(f"unix:{tmp_path}/missing.sock", agent="Sandboxed", deadline_s=0.3) as client:
            bad = await client.check_tool("read_note", {"name": "n"})
        return ok.decision, bad.decision

    assert asyncio.run(use_async()) == ("ALLOW", "DENY")


def test_launch_through_the_daemon_enforces_and_records_the_session(daemon: RunningDaemon) -> None:
    box = daemon.box
    ok = daemon.adl_exec("cat", str(box.ws / "notes.txt"))
    assert ok.returncode == 0 and ok.stdout == "workspace notes\n", ok.stderr
    assert "ended: exit" in ok.stderr
    denied = daemon.adl_exec("cat", str(box.outside / "private.txt"))
    assert denied.returncode == 1 and "OUTSIDE-CONTENT" not in denied.stdout
    refused = daemon.adl_exec("sh", "-c", "echo hi")
    assert refused.returncode == 125 and "refused" in refused.stderr
    unknown = daemon.adl_exec("cat", "/etc/hostname", agent="Nobody")
    assert unknown.returncode == 125 and "no policy is loaded" in unknown.stderr
    placed = daemon.adl_exec("cat", "/proc/self/status")
    assert placed.returncode == 0, placed.stderr
    assert _allowed_cpus(placed.stdout) == os.sched_getaffinity(0)  # sessions keep every CPU...
    assert daemon.proc is not None
    nice = []
    for task in Path(f"/proc/{daemon.proc.pid}/task").iterdir():  # ...while the API process has one
        assert _allowed_cpus((task / "status").read_text()) == {max(os.sched_getaffinity(0))}
        nice.append(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
    assert sorted(nice) == [-10] + [0] * (len(nice) - 1)  # the inline loop (inline_nice), and no other thread
    kinds = [r["intent"].rsplit(".", 1)[-1] for r in daemon.records()]
    assert kinds.count("launch") == 3 and kinds.count("exit") == 3 and kinds.count("refused") == 2
    launch = next(r for r in daemon.records() if r["intent"].endswith(".launch"))
    assert launch["payload"]["agent"] == "Sandboxed" and launch["from"] == "adl-enforcerd"


def _allowed_cpus(status: str) -> set[int]:
    line = next(x for x in status.splitlines() if x.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def test_max_concurrent_session_identity_and_terminate(daemon: RunningDaemon) -> None:
    session_file = daemon.box.ws / "session.json"  # written by the client, which runs as the agent's uid
    first = subprocess.Popen(
        daemon.exec_argv("python3", "-c", "import time; time.sleep(30)", options=("--session-file", str(session_file))),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not (session_file.exists() and session_file.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert oct(session_file.stat().st_mode & 0o777) == "0o600"
        session = json.loads(session_file.read_text())
        second = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"))
        assert second.returncode == 125 and "max_concurrent is 1" in second.stderr

        stub = daemon.enforcer()
        bound = stub.Check(
            pb.CheckRequest(
                session=session["session"],
                session_token=session["session_token"],
                tool=pb.ToolCall(name="read_note", arguments_json='{"name": "n"}'),
            )
        )
        assert bound.decision == pb.ALLOW and bound.agent == "Sandboxed"
        assert by_decision_id(daemon, bound.decision_id)["corr"] == session["session"]
        for request, code in [
            (
                pb.CheckRequest(session=session["session"], session_token="guess", tool=pb.ToolCall(name="x")),
                "UNAUTHENTICATED",
            ),
            (
                pb.CheckRequest(
                    session=session["session"],
                    session_token=session["session_token"],
                    agent="Fast",
                    tool=pb.ToolCall(name="pay"),
                ),
                "PERMISSION_DENIED",
            ),
        ]:
            with pytest.raises(grpc.RpcError) as err:
                stub.Check(request)
            assert err.value.code().name == code
        status = stub.Status(pb.StatusRequest())
        assert [s.session for s in status.sessions] == [session["session"]]
        assert next(a for a in status.agents if a.key == "Sandboxed").sessions == 1
        assert daemon.admin_stub().TerminateSession(pb.TerminateSessionRequest(session=session["session"])).terminated
        first.wait(timeout=20)
        assert first.returncode == 137, first.stderr  # SIGKILL
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()


def test_a_caller_that_goes_away_ends_its_session_at_any_step(daemon: RunningDaemon) -> None:
    """adl-exec killed (Ctrl-C, SIGKILL) as soon as the daemon has accepted its launch, while the
    supervisor still compiles and plans, or once the agent runs: the session ends then, never at
    the policy's max_duration_sec (5 s here) with nobody left to see it. Early leaves race the
    stage's own cgroup join, hence the repeats."""
    for attempt, after_start in enumerate((False, False, False, False, True)):
        session_file = daemon.box.ws / f"session-{attempt}.json"
        argv = daemon.exec_argv(
            "python3",
            "-c",
            "import time; print('up', flush=True); time.sleep(60)",
            options=("--session-file", str(session_file)),
        )
        client = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 20
            if after_start:
                assert client.stdout is not None and client.stdout.readline() == "up\n"
            else:
                while not (session_file.exists() and session_file.stat().st_size):
                    assert time.monotonic() < deadline and client.poll() is None
                    time.sleep(0.001)
            client.kill()
            client.wait(timeout=10)
            session = json.loads(session_file.read_text())["session"]
            ends: list[dict] = []
            while not ends and time.monotonic() < deadline:
                time.sleep(0.05)
                ends = [
                    r for r in daemon.records() if r["corr"] == session and r["intent"].endswith((".exit", ".refused"))
                ]
            assert ends, (attempt, "the session's end is not in the log")
            reason = ends[0]["payload"]["reason"]
            assert reason != "timeout", (attempt, "the agent outlived its caller")
            if after_start:
                assert reason == "signal", reason
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    deadline = time.monotonic() + 10
    while daemon.sessions_left() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert daemon.sessions_left() == []


def _sleeping_session(daemon: RunningDaemon) -> tuple[subprocess.Popen[str], int, int]:
    """A daemon session whose agent sleeps: (its client, its supervisor's pid, its agent's pid)."""
    client = subprocess.Popen(
        daemon.exec_argv("python3", "-c", "import os, time; print(os.getpid(), flush=True); time.sleep(60)"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None and client.stdout.readline()
    (info,) = daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions
    (group,) = cgroups.existing(group=daemon.group).values()
    agents = [pid for pid in group.members() if b"time.sleep(60)" in Path(f"/proc/{pid}/cmdline").read_bytes()]
    assert info.pid > 0 and len(agents) == 1, group.members()
    return client, info.pid, agents[0]


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text():
            return True
        time.sleep(0.01)
    return False


def test_a_supervisor_killed_takes_its_session_with_it_through_the_spawner(daemon: RunningDaemon) -> None:
    """A daemon session has no guardian of its own: the spawner, the supervisor's parent, kills the
    session's processes and removes its cgroup as soon as the supervisor is gone."""
    client, supervisor, agent = _sleeping_session(daemon)
    try:
        under = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
        commands = [Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in under]
        assert not [c for c in commands if c[1:3] == [b"-S", b"-I"]], commands  # no guardian per session
        os.kill(supervisor, signal.SIGKILL)
        assert _gone_within(agent, 2), "the agent outlived its supervisor"
        deadline = time.monotonic() + 2
        while daemon.sessions_left() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.sessions_left() == []
        client.wait(timeout=20)
        assert client.returncode != 0
        # The spawner still serves: the next session runs.
        assert daemon.adl_exec("python3", "-c", "pass").returncode == 0
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_the_spawner_killed_takes_every_session_with_it_through_its_guardian(daemon: RunningDaemon) -> None:
    client, supervisor, agent = _sleeping_session(daemon)
    try:
        spawner = int(Path(f"/proc/{supervisor}/stat").read_text().rsplit(")", 1)[1].split()[1])
        assert spawner != daemon.proc.pid
        os.kill(spawner, signal.SIGKILL)
        assert _gone_within(agent, 5), "the agent outlived the spawner"
        deadline = time.monotonic() + 5
        while daemon.sessions_left() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert daemon.sessions_left() == []
        client.wait(timeout=20)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()


def test_daemon_killed_mid_session_restarts_clean_with_a_continuous_audit_chain(daemon: RunningDaemon) -> None:
    client = subprocess.Popen(
        daemon.exec_argv("python3", "-c", "import time; print('up', flush=True); time.sleep(60)"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None and client.stdout.readline() == "up\n"
        assert daemon.sessions_left()  # the session's cgroup exists
        daemon.kill()
        client.wait(timeout=20)
        assert client.returncode == 125 and "lost contact" in client.stderr.read()  # type: ignore[union-attr]
        deadline = time.monotonic() + 15
        while daemon.sessions_left() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.sessions_left() == []  # the guardian killed the agent with its supervisor
        daemon.start()
        assert daemon.enforcer().Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    daemon.stop()
    report = verify_directory(daemon.audit)
    assert report.intact and report.unsealed == 0, report
    gaps = [r for r in daemon.records() if r["intent"].endswith(".gap")]
    assert gaps and all(g["payload"]["reason"] == "writer_stopped_uncleanly" for g in gaps)
    assert len([r for r in daemon.records() if r["intent"].endswith(".daemon.start")]) == 2


def test_leftover_session_cgroups_are_killed_and_recorded_on_start(daemon: RunningDaemon) -> None:
    from enforcer.sandbox import cgroups

    daemon.stop()
    group = cgroups.create("session-leftover", group=daemon.group)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        for f in group.join_files():
            Path(f).write_text(str(sleeper.pid))
        daemon.start()
        assert sleeper.wait(timeout=10) == -9
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
            sleeper.wait()
    reaped = [r for r in daemon.records() if r["intent"].endswith(".session.reaped")]
    assert reaped and reaped[0]["payload"]["session"] == "session-leftover"
    assert reaped[0]["payload"]["killed_pids"] == [sleeper.pid] and reaped[0]["payload"]["removed"]


def test_audit_failure_makes_checks_unavailable_and_flips_health(daemon: RunningDaemon, tmp_path: Path) -> None:
    daemon.stop()
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        daemon.audit = mount / "audit"
        daemon.start()
        stub = daemon.enforcer()
        assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
        filler = mount / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        with pytest.raises(OSError):
            for _ in range(1024):
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        codes = []
        for _ in range(200):  # the next page of the log cannot be allocated
            try:
                stub.Check(tool_request("Sandboxed", "read_note", {"name": "n" * 2000}), timeout=5)
            except grpc.RpcError as exc:
                codes.append(exc.code())
                break
        assert codes == [grpc.StatusCode.UNAVAILABLE]
        assert daemon.health() == "NOT_SERVING"
        with pytest.raises(grpc.RpcError) as again:
            stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"}), timeout=5)
        assert again.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "audit" in stub.Status(pb.StatusRequest()).audit_error
        filler.unlink()
        deadline = time.monotonic() + 10
        while daemon.health() != "SERVING" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert daemon.health() == "SERVING"
        assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
        gaps = [r for r in daemon.records() if r["intent"].endswith(".gap")]
        assert any(g["payload"]["reason"] == "audit_write_failed" for g in gaps)
        daemon.stop()
        assert verify_directory(daemon.audit).intact
    finally:
        daemon.stop()
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_print_config_layers_defaults_toml_and_environment(tmp_path: Path) -> None:
    config = tmp_path / "enforcer.toml"
    config.write_text('policy_dir = "/srv/policies"\nworkers = 4\nsocket = "/srv/api.sock"\n')
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADL_ENFORCER_")}
    env["ADL_ENFORCER_SOCKET"] = "/env/api.sock"
    run = [sys.executable, "-m", "enforcer.cli.enforcerd", "--config", str(config), "--print-config"]
    out = subprocess.run([*run, "--json"], capture_output=True, text=True, env=env, check=True).stdout
    effective = json.loads(out)
    assert effective["policy_dir"] == "/srv/policies" and effective["workers"] == 4
    assert effective["socket"] == "/env/api.sock"  # environment beats the file
    toml = subprocess.run(run, capture_output=True, text=True, env=env, check=True).stdout
    assert 'socket = "/env/api.sock"' in toml
    config.write_text("wokers = 4\n")
    typo = subprocess.run(run, capture_output=True, text=True, env=env)
    assert typo.returncode == 2 and "wokers" in typo.stderr


def test_systemd_notifications_ready_reloading_status_watchdog(daemon: RunningDaemon, tmp_path: Path) -> None:
    import socket

    daemon.stop()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify.sock"))
        notify.settimeout(10)
        daemon.extra_env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"}
        daemon.start()

        def until(field: str) -> str:
            for _ in range(50):
                message = notify.recv(4096).decode()
                if field in message.split("\n"):
                    return message
            raise AssertionError(f"no {field}")

        assert "STATUS=serving 2 agent(s)" in until("READY=1")
        until("WATCHDOG=1")
        daemon.proc.send_signal(1)  # type: ignore[union-attr]  # SIGHUP
        assert any(f.startswith("MONOTONIC_USEC=") for f in until("RELOADING=1").split("\n"))
        until("READY=1")
        daemon.proc.terminate()  # type: ignore[union-attr]
        until("STOPPING=1")


def test_example_runtime_integration_runs_tools_only_when_allowed(daemon: RunningDaemon) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "guarded_tools", Path(__file__).parents[2] / "examples" / "guarded_tools.py"
    )
    assert spec and spec.loader
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    ran: list[str] = []

    @example.guarded(client, "read_note")
    def read_note(name: str) -> str:
        ran.append(name)
        return name.upper()

    asked: list[str] = []
    approvers: list[threading.Timer] = []
    admin = daemon.admin_stub()

    def approve_later(result: object) -> None:
        asked.append(result.approval_id)  # type: ignore[attr-defined]
        decision = pb.ApprovalDecision(approval_id=asked[0], approver="carol")
        approver = threading.Timer(0.3, lambda: admin.Approve(decision))
        approvers.append(approver)
        approver.start()

    @example.guarded(client, "delete_note", on_ask=approve_later)
    def delete_note(name: str) -> str:
        ran.append("deleted " + name)
        return "gone"

    assert read_note(name="a") == "A"
    with pytest.raises(example.ToolDenied, match=r"tool\.args_invalid"):
        read_note(name=7)
    assert delete_note(name="b") == "gone" and asked
    assert ran == ["a", "deleted b"]  # the denied call never ran
    for approver in approvers:
        approver.join(timeout=10)  # its Approve call returns before the daemon is stopped
    client.close()


def _nested(depth: int) -> str:
    return '{"name": "n", "count": ' + "[" * depth + "]" * depth + "}"


def test_poison_arguments_fail_alone_while_another_client_sees_no_failure(daemon: RunningDaemon) -> None:
    """Arguments nested deeper than the audit record's encoder goes once took the log down for
    everyone (UNAVAILABLE) or failed every request handled with them (INTERNAL). Now each is refused
    alone with INVALID_ARGUMENT naming the limit, the log stays healthy, and a well-behaved client
    running meanwhile sees no failure at all."""
    stop = threading.Event()
    failures: list[str] = []
    answered = [0]
    unhealthy: list[str] = []

    def well_behaved() -> None:
        stub = daemon.enforcer()
        while not stop.is_set():
            try:
                reply = stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"}), timeout=5)
                if reply.decision != pb.ALLOW:
                    failures.append(f"decision {reply.decision}")
                batch = stub.CheckBatch(
                    pb.CheckBatchRequest(requests=[tool_request("Sandboxed", "read_note", {"name": "b"})] * 3),
                    timeout=5,
                )
                if [r.decision for r in batch.responses] != [pb.ALLOW] * 3:
                    failures.append("batch")
            except grpc.RpcError as exc:
                failures.append(f"{exc.code()}: {exc.details()}")
            answered[0] += 1

    def watch_health() -> None:
        while not stop.is_set():
            if (state := daemon.health()) != "SERVING":
                unhealthy.append(state)
            time.sleep(0.02)

    threads = [threading.Thread(target=well_behaved) for _ in range(3)] + [threading.Thread(target=watch_health)]
    for t in threads:
        t.start()
    stub = daemon.enforcer()
    codes: dict[str, list[str]] = {}
    try:
        deadline = time.monotonic() + 4
        rounds = 0
        while time.monotonic() < deadline:
            for depth in (250, 254, 300, 1024):
                poison = pb.CheckRequest(
                    agent="Sandboxed", tool=pb.ToolCall(name="read_note", arguments_json=_nested(depth))
                )
                calls = [
                    ("check", stub.Check.future(poison, timeout=5)),
                    ("explain", stub.Explain.future(poison, timeout=5)),
                    ("batch", stub.CheckBatch.future(pb.CheckBatchRequest(requests=[poison]), timeout=5)),
                ]
                for name, call in calls:
                    error = call.exception()
                    codes.setdefault(name, []).append(
                        "answered" if error is None else f"{error.code().name} {error.details()}"
                    )
            rounds += 1
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert rounds > 3 and answered[0] > 20, (rounds, answered)
    for name, seen in codes.items():
        assert all(c.startswith("INVALID_ARGUMENT") and "max_argument_depth (32)" in c for c in seen), (name, seen[:3])
    assert failures == [] and unhealthy == [], (failures[:5], unhealthy[:5])
    assert not [r for r in daemon.records() if r["intent"].endswith(".gap")]  # the log never failed


def test_duplicate_argument_names_are_refused(daemon: RunningDaemon) -> None:
    stub = daemon.enforcer()
    # The second "amount" would have won and passed the approval threshold of 100.
    twice = pb.CheckRequest(agent="Fast", tool=pb.ToolCall(name="pay", arguments_json='{"amount": 500, "amount": 5}'))
    with pytest.raises(grpc.RpcError) as refused:
        stub.Check(twice, timeout=5)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "duplicate member name 'amount'" in refused.value.details()
    nested = '{"name": "n", "count": 1, "x": {"a": 1, "b": {"c": 1, "c" : 2}}}'
    with pytest.raises(grpc.RpcError) as deep:
        stub.Check(pb.CheckRequest(agent="Sandboxed", tool=pb.ToolCall(name="read_note", arguments_json=nested)))
    assert deep.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'c'" in deep.value.details()
    # the same name in different objects, and name-like text inside a string, are fine
    fine = '{"name": "a\\": \\"name\\":", "count": 1}'
    reply = stub.Check(pb.CheckRequest(agent="Sandboxed", tool=pb.ToolCall(name="read_note", arguments_json=fine)))
    assert reply.decision == pb.ALLOW
    assert stub.Check(tool_request("Fast", "pay", {"amount": 500})).decision == pb.ASK


def test_argument_and_request_size_limits_are_invalid_argument_naming_the_limit(daemon: RunningDaemon) -> None:
    stub = daemon.enforcer()
    cases = [
        ({"name": "x" * 300_000}, "max_argument_string (262144)"),
        ({"name": "n", "list": list(range(10_001))}, "max_argument_items (10000)"),
        ({"name": "n", **{f"k{i}": i for i in range(10_001)}}, "max_argument_items (10000)"),
    ]
    for arguments, limit in cases:
        with pytest.raises(grpc.RpcError) as refused:
            stub.Check(tool_request("Sandboxed", "read_note", arguments), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and limit in refused.value.details()
    # Over max_request_bytes (1 MiB): refused by the daemon, naming the limit. Beyond the transport's
    # cap (4 x max_request_bytes) gRPC's core refuses the message unread, with its own status.
    with pytest.raises(grpc.RpcError) as big:
        stub.Check(tool_request("Sandboxed", "read_note", {"name": "x" * (2 << 20)}), timeout=10)
    assert big.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "max_request_bytes (1048576)" in big.value.details()
    with pytest.raises(grpc.RpcError) as huge:
        stub.Check(tool_request("Sandboxed", "read_note", {"name": "x" * (5 << 20)}), timeout=10)
    assert huge.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in huge.value.details()
    assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "x" * 200_000})).decision == pb.ALLOW


def test_check_batch_is_checked_whole_before_anything_is_decided(daemon: RunningDaemon) -> None:
    stub = daemon.enforcer()
    admin = daemon.admin_stub()
    ask = tool_request("Sandboxed", "delete_note", {"name": "a"}, request_id="batch-ask")
    allow = tool_request("Sandboxed", "read_note", {"name": "a"}, request_id="batch-allow")
    for bad, needle in [
        (pb.CheckRequest(agent="Sandboxed", request_id="batch-bad"), "requests[2]: the request names no action"),
        (tool_request("Nobody", "read_note", {}), "requests[2]: no policy is loaded for agent 'Nobody'"),
        (
            pb.CheckRequest(agent="Fast", tool=pb.ToolCall(name="pay", arguments_json='{"amount": 1, "amount": 2}')),
            "requests[2]: tool.arguments_json: duplicate member name",
        ),
    ]:
        with pytest.raises(grpc.RpcError) as refused:
            stub.CheckBatch(pb.CheckBatchRequest(requests=[ask, allow, bad]), timeout=5)
        assert needle in refused.value.details() and "nothing in the batch was decided" in refused.value.details()
    # the items of a batch's requests count together
    half = tool_request("Sandboxed", "read_note", {"name": "n", "list": list(range(6_000))})
    assert stub.CheckBatch(pb.CheckBatchRequest(requests=[half])).responses[0].decision == pb.DENY  # extra member
    with pytest.raises(grpc.RpcError) as budget:
        stub.CheckBatch(pb.CheckBatchRequest(requests=[allow, half, half]), timeout=5)
    assert budget.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "requests[2]: " in budget.value.details()
    assert admin.ListPending(pb.ListPendingRequest()).pending == []  # no approval nobody was told of
    ids = {r["payload"].get("request_id") for r in daemon.records()}
    assert not ids & {"batch-ask", "batch-allow", "batch-bad"}  # nothing decided, nothing recorded
    whole = stub.CheckBatch(pb.CheckBatchRequest(requests=[ask, allow]))
    assert [r.decision for r in whole.responses] == [pb.ASK, pb.ALLOW]
    assert [p.approval_id for p in admin.ListPending(pb.ListPendingRequest()).pending] == [
        whole.responses[0].approval_id
    ]


def test_an_emptied_or_missing_policy_directory_keeps_the_last_good_policies(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    import socket

    daemon.stop()
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify.sock"))
    notify.settimeout(5)
    daemon.extra_env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}
    daemon.start()
    admin = daemon.admin_stub()
    stub = daemon.enforcer()
    saved = daemon.root / "saved-policies"
    daemon.policies.rename(saved)
    try:
        daemon.policies.mkdir()
        for how in ("empty", "missing"):
            if how == "missing":
                daemon.policies.rmdir()
            reply = admin.ReloadPolicies(pb.ReloadRequest())
            assert reply.agents == 2 and len(reply.problems) == 1, reply
            assert "the 2 agent(s) loaded before are kept" in reply.problems[0].detail
            assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
            status = stub.Status(pb.StatusRequest())
            assert status.serving and len(status.agents) == 2 and "kept" in status.problems[0].detail
            assert daemon.health() == "SERVING"
        lines = []
        for _ in range(50):  # systemd's status line says so too
            lines.append(notify.recv(4096).decode())
            if "loaded before are kept" in lines[-1]:
                break
        assert "STATUS=serving 2 agent(s): policy directory" in lines[-1], lines
    finally:
        notify.close()
        if daemon.policies.exists():
            daemon.policies.rmdir()
        saved.rename(daemon.policies)
    reply = admin.ReloadPolicies(pb.ReloadRequest())
    assert reply.agents == 2 and not reply.problems
    assert "policy directory holds no ADL document: the 2 agent(s) loaded before are kept" in daemon.log.read_text()


def test_a_second_daemon_is_refused_and_the_first_keeps_its_sessions_and_sockets(daemon: RunningDaemon) -> None:
    session = subprocess.Popen(
        daemon.exec_argv("python3", "-c", "import time; print('up', flush=True); time.sleep(60)"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert session.stdout is not None and session.stdout.readline() == "up\n"
        sessions = daemon.sessions_left()
        assert len(sessions) == 1
        sockets = {p: p.stat().st_ino for p in (daemon.api, daemon.admin, daemon.launch)}
        assert daemon.proc is not None
        elsewhere = daemon.root / "elsewhere"
        for env in (
            daemon.env(),  # the same configuration
            {  # own sockets and audit log, but the same cgroup group: its sessions are the first one's
                **daemon.env(),
                "ADL_ENFORCER_SOCKET": str(elsewhere / "api.sock"),
                "ADL_ENFORCER_ADMIN_SOCKET": str(elsewhere / "admin.sock"),
                "ADL_ENFORCER_LAUNCH_SOCKET": str(elsewhere / "launch.sock"),
                "ADL_ENFORCER_AUDIT_DIR": str(elsewhere / "audit"),
            },
        ):
            second = subprocess.run(
                [sys.executable, "-m", "enforcer.cli.enforcerd"], env=env, capture_output=True, text=True, timeout=60
            )
            assert second.returncode == 1, second.stderr
            assert f"another adl-enforcerd (pid {daemon.proc.pid}) holds" in second.stderr
            assert daemon.sessions_left() == sessions and session.poll() is None  # its session lives on
            assert {p: p.stat().st_ino for p in sockets} == sockets  # and its sockets are its own
            assert not (elsewhere / "api.sock").exists()
        assert daemon.health() == "SERVING"
        assert daemon.enforcer().Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
        assert not [r for r in daemon.records() if r["intent"].endswith(".session.reaped")]
    finally:
        session.kill()
        session.wait()
    daemon.stop()
    assert not any(p.exists() for p in (daemon.api, daemon.admin))  # a clean stop removes its own sockets
    assert not daemon.api.with_name("api.sock.lock").exists()


@pytest.fixture
def frozen_able_mount(tmp_path: Path) -> Iterator[Path]:
    """A small ext4 file system on a loop device, which fsfreeze can freeze; thawed and unmounted
    even when the test fails."""
    for tool in ("mkfs.ext4", "fsfreeze"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    image, mount = tmp_path / "fs.img", tmp_path / "frozen"
    with open(image, "wb") as f:
        f.truncate(32 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mount.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["fsfreeze", "-u", str(mount)], capture_output=True)
        if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], check=False)  # still busy: detached once unused


def test_a_stalled_audit_log_turns_health_not_serving_and_stops_the_watchdog(
    frozen_able_mount: Path, daemon: RunningDaemon, tmp_path: Path
) -> None:  # the mount first: it is taken down after the daemon
    import socket

    daemon.stop()
    daemon.audit = frozen_able_mount / "audit"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify.sock"))
        notify.settimeout(0.1)
        daemon.extra_env = {
            "NOTIFY_SOCKET": str(tmp_path / "notify.sock"),
            "WATCHDOG_USEC": "400000",
            "ADL_ENFORCER_AUDIT_WRITE_DEADLINE_S": "1",
        }
        daemon.start()

        def pings(seconds: float) -> int:
            count, until = 0, time.monotonic() + seconds
            while time.monotonic() < until:
                with contextlib.suppress(TimeoutError):
                    count += "WATCHDOG=1" in notify.recv(4096).decode().split("\n")
            return count

        stub = daemon.enforcer()
        assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
        assert pings(1.0) >= 2
        subprocess.run(["fsfreeze", "-f", str(frozen_able_mount)], check=True)
        try:
            stuck = stub.Check.future(tool_request("Sandboxed", "read_note", {"name": "n"}), timeout=30)
            deadline = time.monotonic() + 10
            while daemon.health() != "NOT_SERVING" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert daemon.health() == "NOT_SERVING"
            status = stub.Status(pb.StatusRequest(), timeout=2)  # still answered
            assert not status.serving and "audit log stalled" in status.audit_error
            pings(0.3)  # one may have been on its way
            assert pings(1.5) == 0  # systemd would restart a daemon stuck for WatchdogSec
            with pytest.raises(grpc.RpcError) as explain:  # a worker-thread caller fails at once
                stub.Explain(tool_request("Sandboxed", "read_note", {"name": "n"}), timeout=5)
            assert explain.value.code() == grpc.StatusCode.UNAVAILABLE and "stalled" in explain.value.details()
        finally:
            subprocess.run(["fsfreeze", "-u", str(frozen_able_mount)], check=True)
        assert stuck.result().decision == pb.ALLOW  # it was recorded once the disk came back
        deadline = time.monotonic() + 10
        while daemon.health() != "SERVING" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert daemon.health() == "SERVING" and stub.Status(pb.StatusRequest()).serving
        assert pings(1.0) >= 2
        assert stub.Check(tool_request("Sandboxed", "read_note", {"name": "n"})).decision == pb.ALLOW
        assert "audit log writes are returning again" in daemon.log.read_text()
    daemon.stop()
    assert verify_directory(daemon.audit).intact
