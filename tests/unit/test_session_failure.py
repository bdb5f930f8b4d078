"""run_session when the launch itself fails: the kernel-denial reader it started is finished (its
thread and netlink socket stopped, what it saw recorded) and the launch's own error is raised."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from enforcer import session
from enforcer.audit import AuditWriter, records
from enforcer.sandbox import launcher

from ..helpers.documents import base_adl, compile_doc


class Reader:
    def __init__(self, fails: bool = False) -> None:
        self.finished = 0
        self.fails = fails

    def finish(self) -> dict[str, Any]:
        self.finished += 1
        if self.fails:
            raise OSError("the reader's socket is gone")
        return {"available": False, "why": "test"}


def plan() -> Any:
    return SimpleNamespace(
        secrets=(),
        argv=["true"],
        executable="/bin/true",
        layers=[],
        accepted_unenforced=[],
        baseline=SimpleNamespace(path=Path("/nonexistent/baseline.yaml"), digest="sha256:0"),
        env={},
        env_dropped=[],
    )


@pytest.mark.parametrize("reader_fails", [False, True])
def test_a_failed_launch_finishes_the_kernel_denials_and_raises_its_own_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schemas: Any, reader_fails: bool
) -> None:
    reader = Reader(fails=reader_fails)
    monkeypatch.setattr(session.SessionDenials, "start", staticmethod(lambda *args, **kw: reader))

    def fails(*args: Any, **kw: Any) -> Any:
        kw["before_agent"]()  # as _run does before it starts the egress filter
        raise launcher.LaunchError("sandbox setup failed: the egress filter did not start")

    monkeypatch.setattr(session, "_run", fails)
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    try:
        with pytest.raises(launcher.LaunchError, match="egress filter did not start"):
            session.run_session(compile_doc(schemas, base_adl()), plan(), writer, "s-failed", uid=54321, gid=54321)
    finally:
        writer.close()
    assert reader.finished == 1


def test_the_session_s_end_is_written_and_synced_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schemas: Any
) -> None:
    """The creation guard's refusals, the exit record and the signed evidence: one write and one
    sync, in that order, all durable before run_session returns."""
    from enforcer.audit.query import iter_records

    monkeypatch.setattr(session.SessionDenials, "start", staticmethod(lambda *args, **kw: Reader()))
    refusal = {"syscall": "openat", "path": "/tmp/x.sh", "rule": "deny_create", "pid": 7}
    outcome = launcher.Outcome("exit", 0, None, 0.01, 7, guard_refusals=[refusal], guard_refused_total=1)

    def runs(*args: Any, **kw: Any) -> Any:
        kw["before_agent"]()  # the launch record, synced, before the agent starts
        return outcome, None

    monkeypatch.setattr(session, "_run", runs)
    ends = plan()
    ends.limits = SimpleNamespace(memory_bytes=None, cpu_percent=None, pids_max=64)
    ends.timeout_s, ends.residual, ends.landlock = None, [], SimpleNamespace(abi=7)
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    writes: list[tuple[list[str], bool]] = []
    append_many = writer.append_many

    def counted(entries: Any, *, sync: bool = False) -> Any:
        writes.append(([e.kind for e in entries], sync))
        return append_many(entries, sync=sync)

    monkeypatch.setattr(writer, "append_many", counted)
    try:
        session.run_session(compile_doc(schemas, base_adl()), ends, writer, "s-ended", uid=54321, gid=54321)
        assert writes[-1] == ([records.DECISION, records.EXIT, records.EVIDENCE], True)
        assert writer.durable_seq == max(r["seq"] for r in iter_records(tmp_path / "log"))
    finally:
        writer.close()
    kinds = [r["intent"] for r in iter_records(tmp_path / "log") if r.get("corr") == "s-ended"]
    assert kinds == [
        f"adl.enforcer.{kind}" for kind in (records.LAUNCH, records.DECISION, records.EXIT, records.EVIDENCE)
    ]


def test_a_session_without_its_launch_record_synced_is_not_reported_as_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schemas: Any
) -> None:
    """The launch record is synced from before_agent, which the launcher calls before the agent can
    start: a run that skipped it is an error, never an exit record for an unrecorded launch."""
    from enforcer.audit.query import iter_records

    monkeypatch.setattr(session.SessionDenials, "start", staticmethod(lambda *args, **kw: Reader()))
    outcome = launcher.Outcome("exit", 0, None, 0.01, 7)
    monkeypatch.setattr(session, "_run", lambda *args, **kw: (outcome, None))
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    try:
        with pytest.raises(launcher.LaunchError, match="without its launch record on stable storage"):
            session.run_session(compile_doc(schemas, base_adl()), plan(), writer, "s-skipped", uid=54321, gid=54321)
    finally:
        writer.close()
    kinds = [r["intent"] for r in iter_records(tmp_path / "log") if r.get("corr") == "s-skipped"]
    assert f"adl.enforcer.{records.EXIT}" not in kinds and f"adl.enforcer.{records.EVIDENCE}" not in kinds
