"""Kernel audit records parsed as the kernel writes them; the denial log's bounds under a flood."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

from enforcer.documents import schema_set
from enforcer.policy import CompileOptions, compile_policy
from enforcer.sandbox import kernel_audit as ka
from enforcer.sandbox.denial_report import report_lines
from enforcer.sandbox.denials import DenialLog, Limits

ACCESS = b'audit(1795621820.565:4): domain=1d7054978 blockers=fs.read_file path="/etc/hostname" dev="vda" ino=612'
DOMAIN = (
    b"audit(1795621820.565:4): domain=1d7054978 status=allocated mode=enforcing pid=6113 uid=0 "
    b'exe="/usr/bin/python3" comm="python3"'
)
SYSCALL = (
    b"audit(1795621820.565:4): arch=c000003e syscall=257 success=no exit=-13 a0=ffffff9c items=0 ppid=6069 "
    b'pid=6113 auid=4294967295 uid=0 comm="cat" exe="/usr/bin/cat" key=(null)'
)


def test_a_landlock_event_becomes_one_denial_with_its_process() -> None:
    records = [ka.parse_record(t, b) for t, b in ((1423, ACCESS), (1424, DOMAIN), (1300, SYSCALL))]
    [denial] = ka.denials_of([r for r in records if r is not None])
    assert denial.mechanism == "landlock" and denial.blockers == ("fs.read_file",) and denial.path == "/etc/hostname"
    assert denial.pid == 6113 and denial.comm == "cat" and denial.exe == "/usr/bin/cat" and denial.syscall == 257
    assert denial.domain == "1d7054978" and denial.domain_creator == 6113 and denial.serial == 4


def test_untrusted_strings_are_hex_decoded_and_cannot_inject_fields() -> None:
    # A file named 'x" blockers=fs.execute' is printed hex-encoded by the kernel.
    name = b'x" blockers=fs.execute'.hex().upper()
    fields = ka.parse_fields(f'domain=1 blockers=fs.read_file path={name} dev="vda"')
    assert fields["path"] == 'x" blockers=fs.execute' and fields["blockers"] == "fs.read_file"
    assert ka.parse_fields('path="616263"')["path"] == "616263"  # quoted values are taken literally


def test_seccomp_errno_answers_are_denials_but_enosys_fallbacks_are_not() -> None:
    eperm = (
        b'audit(1.2:9): auid=1 uid=0 ses=1 pid=77 comm="python3" exe="/usr/bin/python3" sig=0 arch=c000003e '
        b"syscall=425 compat=0 ip=0x1 code=0x50001"
    )
    enosys = eperm.replace(b"code=0x50001", b"code=0x50026")
    notify = eperm.replace(b"code=0x50001", b"code=0x7fc00000")
    assert [d.syscall for d in ka.denials_of([ka.parse_record(1326, eperm)])] == [425]  # type: ignore[list-item]
    assert ka.denials_of([ka.parse_record(1326, enosys)]) == []  # type: ignore[list-item]
    assert ka.denials_of([ka.parse_record(1326, notify)]) == []  # type: ignore[list-item]


class Appender:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def append(self, kind: str, payload: dict[str, Any], **kw: Any) -> None:
        self.records.append(payload)


def _policy() -> Any:
    doc = {
        "adl_spec": "0.3.0",
        "name": "T",
        "description": "t",
        "version": "1.0.0",
        "data_classification": {"sensitivity": "internal"},
        "permissions": {"filesystem": {"allowed_paths": [{"path": "/data/**", "access": "read"}]}},
    }
    return compile_policy(doc, None, schema_set(), datetime.now(UTC), CompileOptions())


def test_a_flood_is_counted_exactly_and_written_within_the_bounds() -> None:
    now = [0.0]
    out = Appender()
    log = DenialLog(
        out, _policy(), "s-1", Limits(max_detailed=50, burst=10, per_s=5, summary_every_s=10), lambda: now[0]
    )
    for i in range(100_000):
        now[0] = i / 10_000  # 10 s of denials
        log(ka.Denial("landlock", 0.0, i, 9, "a", "/bin/a", ("fs.read_file",), path=f"/x/{i % 1000}"))
    log.close()
    one_by_one = [r for r in out.records if "summary" not in r]
    summaries = [r for r in out.records if "summary" in r]
    assert 10 <= len(one_by_one) <= 10 + 5 * 10 + 1 and len(summaries) <= 3
    assert summaries[-1]["summary"] == "final" and summaries[-1]["denials"] == 100_000
    assert len(summaries[-1]["top"]) <= 20 and one_by_one[0]["rules"] == ["fs.not_allowed"]
    assert one_by_one[0]["grant"]["value"] == {"path": "/x/0", "access": "read"}
    assert "100000" in report_lines({"available": True, **log.summary()})[0]


def test_a_denied_path_in_the_policy_is_named_not_suggested() -> None:
    out = Appender()
    log = DenialLog(out, _policy(), "s-1")
    log(ka.Denial("landlock", 0.0, 1, 9, "a", "/bin/a", ("fs.write_file",), path="/data/x"))
    [record] = out.records
    assert record["access"] == "write" and record["rules"] == ["fs.mode_not_allowed"]
    assert record["reasons"][0]["pointer"] == "/permissions/filesystem/allowed_paths/0"


def _gone_pid() -> int:
    """A pid no process has (a child that was reaped)."""
    import os

    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def _denial(pid: int, *, ppid: int | None = None, domain: str | None = None, creator: int | None = None) -> ka.Denial:
    return ka.Denial("landlock", 0.0, 1, pid, "cat", "/usr/bin/cat", domain=domain, domain_creator=creator, ppid=ppid)


def test_the_agent_s_domain_is_the_session_s_after_its_processes_are_gone() -> None:
    agent, child = _gone_pid(), _gone_pid()
    who = ka.Attribution("session-x", lambda: (agent,), "adl-test")
    assert who.owns(_denial(agent, domain="d1", creator=agent))  # the agent's own, exited
    assert who.owns(_denial(child, domain="d1"))  # a short-lived child: its domain is known
    assert not who.owns(_denial(child, domain="d2", creator=child))  # a domain someone else made
    assert not who.owns(_denial(child, domain="d2"))


def test_a_gone_process_is_the_session_s_through_its_parent_and_never_by_default() -> None:
    agent, child, stranger = _gone_pid(), _gone_pid(), _gone_pid()
    who = ka.Attribution("session-x", lambda: (agent,), "adl-test")
    assert not who.owns(_denial(stranger, ppid=1))
    assert not who.owns(_denial(stranger))
    assert who.owns(_denial(child, ppid=agent))  # seccomp: no domain, the parent tells
    assert who.owns(_denial(child))  # learned


def test_a_remembered_pid_now_alive_in_another_cgroup_is_not_the_session_s() -> None:
    import os

    # This process stands for a host process that was given a pid the session used before.
    reused = os.getpid()
    who = ka.Attribution("session-x", lambda: (reused,), "adl-test")
    assert not who.owns(_denial(reused))
    assert not who.owns(_denial(reused, domain="d3", creator=reused))
    assert not who.owns(_denial(_gone_pid(), ppid=reused))


def test_unavailable_kernel_auditing_is_said_not_silent(monkeypatch: Any, capsys: Any) -> None:
    from enforcer.sandbox.denials import SessionDenials

    def refuse() -> dict[str, int]:
        raise ka.KernelAuditUnavailable(1, "AUDIT_GET: Operation not permitted")

    monkeypatch.setattr(ka, "status", refuse)
    denials = SessionDenials.start(None, None, "session-x", None, "adl-test", record=True)  # type: ignore[arg-type]
    assert "kernel denials: unavailable (AUDIT_GET: Operation not permitted)" in capsys.readouterr().err
    summary = denials.finish()
    assert summary == {"available": False, "why": "AUDIT_GET: Operation not permitted"}
    assert report_lines(summary) == ["kernel denials: unavailable (AUDIT_GET: Operation not permitted)"]
    assert ka.describe(7).startswith("unavailable here (AUDIT_GET: Operation not permitted)")


def test_kernel_audit_off_neither_reads_nor_turns_on_kernel_auditing(monkeypatch: Any, capsys: Any) -> None:
    from enforcer.sandbox.denials import SessionDenials

    def touched(*_: Any) -> Any:
        raise AssertionError("kernel auditing touched although the kernel_audit setting is off")

    monkeypatch.setattr(ka, "status", touched)
    monkeypatch.setattr(ka, "ensure_enabled", touched)
    denials = SessionDenials.start(None, None, "session-x", None, "adl-test", record=False)  # type: ignore[arg-type]
    assert denials.finish() == {"available": False, "why": "turned off with ADL_ENFORCER_KERNEL_AUDIT"}
    assert capsys.readouterr().err == ""


def test_explain_says_that_a_launch_turns_host_auditing_on(monkeypatch: Any) -> None:
    off = {"mask": 0, "enabled": 0, "failure": 1, "pid": 0, "rate_limit": 0, "backlog_limit": 64, "lost": 0}
    monkeypatch.setattr(ka, "status", lambda: {**off, "backlog": 0})
    assert "kernel auditing is OFF on this host and the launch turns it ON for the whole host" in ka.describe(7)
    assert "Landlock ABI 6 does not report its denials" in ka.describe(6)
    monkeypatch.setattr(ka, "status", lambda: {**off, "enabled": 1, "backlog": 0})
    assert ka.describe(7) == "recorded in the audit log (kernel auditing is on)"


def test_a_session_without_denials_does_not_load_the_grant_explainer() -> None:
    """explain_landlock/explain_seccomp (the policy's grants) are loaded by the first denial."""
    code = "import sys\nfrom enforcer.sandbox import denials\nprint('enforcer.policy.grants' in sys.modules)\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["False"]


def _deny_then_exit(reader_roots: list[int], target: str) -> int:
    """Fork a process that Landlock denies reading `target` and that exits at once; returns its pid,
    reaped. Its pid is known to the attribution before it may deny anything."""
    import os

    from enforcer.sandbox import landlock

    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(go_w)
            os.read(go_r, 1)
            landlock.restrict(landlock.LandlockPlan(abi=landlock.abi_version()))
            try:
                os.open(target, os.O_RDONLY)
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    os.close(go_r)
    reader_roots.append(pid)
    os.write(go_w, b"x")
    os.close(go_w)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the read was not denied"
    return pid


class _ByPid(ka.Attribution):
    """The test's process is in no session's cgroup: its pid alone makes its denials the session's."""

    def owns(self, denial: ka.Denial) -> bool:
        return denial.pid in self.roots()


def _reader_or_skip(roots: list[int], sink: Any) -> ka.Reader:
    import os
    import secrets

    import pytest

    from enforcer.sandbox import landlock

    if os.geteuid() != 0:
        pytest.skip("reading the kernel's audit records needs root")
    if landlock.abi_version() < 7:
        pytest.skip("Landlock reports its denials from ABI 7")
    try:
        ka.ensure_enabled()
        return ka.Reader(_ByPid(f"session-{secrets.token_hex(8)}", lambda: tuple(roots), "adl-test"), sink)
    except ka.KernelAuditUnavailable as exc:
        pytest.skip(f"no kernel audit here: {exc}")


def _denied_once(tmp_path: Any) -> tuple[ka.Reader, list[ka.Denial], int, Any]:
    """A running reader, what it has read, and the pid of a process that was denied reading
    `target` once and has exited."""
    target = tmp_path / "private.txt"
    target.write_text("x")
    roots: list[int] = []
    got: list[ka.Denial] = []
    reader = _reader_or_skip(roots, got.append)
    reader.start()
    return reader, got, _deny_then_exit(roots, str(target)), target


def test_a_denial_just_before_the_process_exits_is_read_by_the_drain_marker(monkeypatch: Any, tmp_path: Any) -> None:
    import time

    reader, got, pid, target = _denied_once(tmp_path)
    asked: list[bool] = []

    def queue_status() -> dict[str, int]:
        asked.append(True)
        raise OSError("the drain ends at its marker, without asking for the kernel's queue")

    monkeypatch.setattr(ka, "status", queue_status)
    started = time.monotonic()
    reader.stop()
    assert reader.error is None
    assert [(d.pid, d.path) for d in got] == [(pid, str(target))]
    assert not asked and time.monotonic() - started < 0.5


def test_without_its_marker_the_drain_still_waits_for_the_kernel_queue(monkeypatch: Any, tmp_path: Any) -> None:
    reader, got, pid, target = _denied_once(tmp_path)
    # A marker the host's audit rules filtered out: queued by nobody, it never arrives.
    monkeypatch.setattr(ka.Reader, "_send_marker", lambda self: b"0" * 32)
    real_status = ka.status
    asked: list[int] = []

    def queue_status() -> dict[str, int]:
        current = real_status()
        asked.append(current["backlog"])
        return current

    monkeypatch.setattr(ka, "status", queue_status)
    reader.stop()
    assert reader.error is None
    assert [(d.pid, d.path) for d in got] == [(pid, str(target))]
    assert asked and asked[-1] == 0
