"""The stage sets the sandbox up while the launch record is written and synced: a sync that fails (a
disk that errors, a full one) must leave the agent unstarted, the failure raised as an audit
failure, and no cgroup behind."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, records
from enforcer.audit.query import iter_records

from ..helpers.sandbox import Sandbox, needs_root, session_cgroups

pytestmark = needs_root


def test_a_launch_record_that_cannot_be_synced_starts_no_agent(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enforcer.documents import load_policy
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.sandbox.stage import new_session_id, prepare
    from enforcer.session import host_features

    marker = sandbox.ws / "ran"
    policy = load_policy(sandbox.policy())
    plan = build_plan(
        policy,
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    synced: list[int | None] = []

    def failing_sync(upto_seq: int | None = None) -> None:
        synced.append(upto_seq)
        time.sleep(0.2)  # the stage is set up and waits for the go meanwhile
        raise AuditUnavailable("fdatasync: Input/output error")

    monkeypatch.setattr(writer, "sync", failing_sync)
    session = new_session_id()
    with pytest.raises(AuditUnavailable, match="Input/output error"):
        sandbox.run_session(
            policy, plan, writer, session, prepare(session, cgroup_group=sandbox.group), kernel_audit=False
        )
    time.sleep(0.3)  # an agent let go by mistake would have written its marker by now
    assert synced and not marker.exists()
    assert session not in session_cgroups(sandbox.group)
    kinds: list[Any] = [r["intent"] for r in iter_records(tmp_path / "log") if r.get("corr") == session]
    assert kinds == [f"adl.enforcer.{records.LAUNCH}"]  # written, then its sync failed: nothing after


@pytest.mark.parametrize("stage_ready", [True, False])
def test_the_launch_record_overlaps_the_stage_and_the_agent_waits_for_its_sync(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, stage_ready: bool
) -> None:
    """A stage that is ready gets its order first: the launch record and the kernel-audit reader's
    start overlap its set-up. One still getting ready does not keep the launcher waiting: the record
    is written first. Either way the agent starts only once the record is synced."""
    from enforcer import session as sessions
    from enforcer.documents import load_policy
    from enforcer.sandbox import pidns
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.sandbox.stage import new_session_id, prepare

    marker = sandbox.ws / "ran"
    policy = load_policy(sandbox.policy())
    plan = build_plan(
        policy,
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=sessions.host_features(),
    )
    if not stage_ready:
        host_pid = pidns.host_pid

        def late() -> int:
            time.sleep(0.5)  # in the future agent, before it announces itself
            return host_pid()

        monkeypatch.setattr(pidns, "host_pid", late)  # the stage is forked with it
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    steps: list[str] = []
    session = new_session_id()
    prepared = prepare(session, cgroup_group=sandbox.group)
    send, append, sync, start = prepared.stage.send, writer.append, writer.sync, sessions.SessionDenials.start

    def sent(*args: Any) -> None:
        send(*args)
        steps.append("order")

    def appended(kind: str, *args: Any, **kw: Any) -> Any:
        steps.append(kind)
        return append(kind, *args, **kw)

    def synced(upto_seq: int | None = None) -> None:
        time.sleep(0.2)  # the stage is set up and waits for the go meanwhile
        steps.append(f"synced, agent started: {marker.exists()}")
        sync(upto_seq)

    def reader(*args: Any, **kw: Any) -> Any:
        steps.append("reader")
        return start(*args, **kw)

    monkeypatch.setattr(prepared.stage, "send", sent)
    monkeypatch.setattr(writer, "append", appended)
    monkeypatch.setattr(writer, "sync", synced)
    monkeypatch.setattr(sessions.SessionDenials, "start", staticmethod(reader))
    try:
        deadline = time.monotonic() + 10
        while stage_ready and not prepared.stage.ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert prepared.stage.ready() is stage_ready
        outcome = sessions.run_session(
            policy, plan, writer, session, uid=65534, gid=65534, cgroup_group=sandbox.group, prepared=prepared
        )
    finally:
        prepared.discard()
        writer.close()
    assert (outcome.reason, outcome.exit_code) == ("exit", 0) and marker.exists()
    first = ["order", records.LAUNCH, "reader"] if stage_ready else [records.LAUNCH, "reader", "order"]
    assert steps[:4] == [*first, "synced, agent started: False"]
