"""The guardian (enforcer/sandbox/guardian.py): a fresh interpreter that removes the session's
cgroup once its launcher's end of the socket closes."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from enforcer.sandbox import cgroups, guardian, stage

from ..helpers.sandbox import Sandbox

ROOT = Path("/sys/fs/cgroup")
needs_cgroups = pytest.mark.skipif(os.geteuid() != 0 or cgroups.detect(ROOT) == "none", reason="needs root and cgroups")


def frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


def test_the_last_whole_frame_counts() -> None:
    first = guardian.encode(["/sys/fs/cgroup/a"], ["/sys/fs/cgroup/a/cgroup.kill"])
    second = guardian.encode(["/sys/fs/cgroup/m/b", "/sys/fs/cgroup/p/b"], [])
    assert guardian.decode_last(b"") is None
    assert guardian.decode_last(frame(first)) == (["/sys/fs/cgroup/a"], ["/sys/fs/cgroup/a/cgroup.kill"])
    both = frame(first) + frame(second)
    assert guardian.decode_last(both) == (["/sys/fs/cgroup/m/b", "/sys/fs/cgroup/p/b"], [])
    for cut in range(1, len(frame(second))):  # the launcher died while sending the second one
        assert guardian.decode_last(frame(first) + frame(second)[:cut])[0] == ["/sys/fs/cgroup/a"]  # type: ignore[index]
    with pytest.raises(ValueError):
        guardian.encode(["/sys/fs/cgroup/a\0b"], [])


def test_the_guardian_imports_nothing_of_the_project() -> None:
    """It runs as `python -S -I guardian.py`: nothing of the project's, nothing it does not need."""
    ours, theirs = socket.socketpair()
    ours.close()  # the launcher is gone: the guardian finds nothing to remove and exits
    run = subprocess.run(
        [sys.executable, "-S", "-I", "-X", "importtime", guardian.__file__, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    theirs.close()
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.count("|") == 2}
    assert imported and not any(name.startswith(("enforcer", "contextlib", "site")) for name in imported), imported


def test_the_guardian_holds_no_enum_module() -> None:
    """It lives as long as the session: `signal` (which builds enums of its constants, loading
    `enum`) is most of what it would otherwise add to a bare interpreter's private memory."""
    ours, theirs = socket.socketpair()
    ours.close()
    run = subprocess.run(
        [sys.executable, "-S", "-I", "-X", "importtime", "-c", stage.GUARDIAN_CODE, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    )
    theirs.close()
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.count("|") == 2}
    assert imported and not {"signal", "enum", "typing", "functools"} & imported, imported


@needs_cgroups
def test_a_session_cgroup_is_removed_with_its_members_when_the_launcher_goes() -> None:
    """As stage.prepare() makes it: forked, exec'd, told the group; then the launcher's end closes
    (as on its death) and the member, double-forked and in its own session, must die."""
    name = f"adl-test-guardian-{uuid.uuid4().hex[:8]}"
    group = cgroups.create(name, ROOT, group=cgroups.GROUP)
    member = None
    try:
        pid, sock = stage._fork(stage._exec_guardian)
        watcher = stage.Guardian(pid, sock)
        watcher.watch(group)
        watcher.confirm()
        member = subprocess.Popen(["sleep", "60"], start_new_session=True)
        for path in group.join_files():
            with open(path, "w") as f:
                f.write(str(member.pid))
        assert member.pid in group.members()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert cmdline[1:4] == [b"-S", b"-I", b"-c"] and cmdline[4] == stage.GUARDIAN_CODE.encode()
        assert Path(guardian.__file__).read_text() == stage.GUARDIAN_CODE
        watcher.reap()  # closes the launcher's end and waits for the guardian
        assert member.wait(timeout=10) == -signal.SIGKILL
        assert not any(Path(d).exists() for d in group.directories)
    finally:
        if member is not None and member.poll() is None:
            member.kill()
        if any(Path(d).exists() for d in group.directories):
            group.remove()


@needs_cgroups
def test_a_guardian_that_cannot_start_is_noticed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    pid, sock = stage._fork(stage._exec_guardian)
    watcher = stage.Guardian(pid, sock)
    try:
        with pytest.raises(OSError, match="guardian did not start"):
            watcher.confirm(timeout_s=10)
    finally:
        watcher.reap()


def test_the_guardian_reads_what_was_sent_before_the_launcher_died(tmp_path: Path) -> None:
    """The launcher may be gone before the guardian runs: what it sent is still acted on."""
    ours, theirs = socket.socketpair()
    directory = tmp_path / "group"  # no cgroup.procs: no members, only the directory to remove
    directory.mkdir()
    ours.sendall(frame(guardian.encode([str(directory)], [])))
    ours.close()
    subprocess.run(
        [sys.executable, "-S", "-I", guardian.__file__, str(theirs.fileno())],
        pass_fds=[theirs.fileno()],
        check=True,
        timeout=30,
    )
    theirs.close()
    assert not directory.exists()


def _guard_a_group_and_release(tmp_path: Path) -> Path:
    """A guardian started as the stage starts one, given a group directory, then released."""
    directory = tmp_path / "group"
    directory.mkdir()
    pid, sock = stage._fork(stage._exec_guardian)
    watcher = stage.Guardian(pid, sock)
    try:
        stage.send_frame(sock, guardian.encode([str(directory)], []))
        watcher.confirm(timeout_s=30)
    finally:
        watcher.reap()
    return directory


def test_the_guardian_runs_the_code_the_launcher_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """guardian.py replaced after the launcher (or the daemon) loaded it, by an upgrade in place or by
    whoever can write there, is not what a session's guardian runs: the launcher's own copy is."""
    marker = tmp_path / "replaced-ran"
    replaced = tmp_path / "guardian.py"
    replaced.write_text(f"import os, sys\nopen({str(marker)!r}, 'w').close()\nos.write(int(sys.argv[1]), b'R')\n")
    monkeypatch.setattr(guardian, "__file__", str(replaced))
    directory = _guard_a_group_and_release(tmp_path)
    assert not marker.exists()
    assert not directory.exists()  # removed by the real guardian once the launcher's end closed


def test_a_launch_whose_guardian_cannot_start_runs_nothing(sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch) -> None:
    """launcher.run asks the guardian before it hands the stage its order: an agent never runs
    without one, and the session's cgroup is removed all the same."""
    from enforcer.documents import load_policy
    from enforcer.sandbox import launcher
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.session import host_features

    marker = sandbox.ws / "ran"
    plan = build_plan(
        load_policy(sandbox.policy()),
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    real_members = cgroups.Cgroup.members
    looked: list[int] = []

    def just_before_the_join(group: cgroups.Cgroup) -> list[int]:
        """The race this reproduces: the launcher finds the group empty, then the stage it forked
        ahead joins it, before the launcher removes the directories."""
        found = real_members(group)
        if not found and not looked:
            looked.append(1)
            deadline = time.monotonic() + 2
            while not real_members(group) and time.monotonic() < deadline:
                time.sleep(0.005)
        return found

    monkeypatch.setattr(cgroups.Cgroup, "members", just_before_the_join)
    session = stage.new_session_id()
    with pytest.raises(launcher.LaunchError, match="sandbox setup failed: the session's guardian did not start"):
        launcher.run(plan, session, cgroup_group=sandbox.group)
    assert not marker.exists()
    # The sandbox fixture then checks that no session cgroup is left: there is no guardian to remove
    # it later, so the launcher removes it once the stage it forked has joined it and is gone.


def test_the_guardian_imports_nothing_from_the_launchers_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """adl-exec runs from the caller's directory, which an agent may have written: modules there,
    named as the standard library's the guardian imports, are not what the guardian (root) loads."""
    marker = tmp_path / "planted-ran"
    for name in ("struct", "signal", "errno", "time", "os"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    directory = _guard_a_group_and_release(tmp_path)
    assert not marker.exists()
    assert not directory.exists()


@needs_cgroups
def test_the_spawner_s_guardian_removes_every_session_below_its_groups() -> None:
    """The daemon's spawner names the directories that hold its sessions: at end of stream every
    session found below them then (made after the frame was sent too) is killed and removed."""
    group = f"adl-test-sessions-{uuid.uuid4().hex[:8]}"
    parents = cgroups.group_directories(ROOT, group=group)
    made, members = [], []
    try:
        pid, sock = stage._fork(stage._exec_guardian)
        watcher = stage.Guardian(pid, sock)
        watcher.watch_sessions(parents)
        watcher.confirm()
        for n in range(2):
            session = cgroups.create(f"session-{n}", ROOT, group=group)
            made.append(session)
            member = subprocess.Popen(["sleep", "60"], start_new_session=True)
            members.append(member)
            for path in session.join_files():
                with open(path, "w") as f:
                    f.write(str(member.pid))
        watcher.reap()
        assert [m.wait(timeout=10) for m in members] == [-signal.SIGKILL, -signal.SIGKILL]
        assert not any(d.exists() for session in made for d in session.directories)
    finally:
        for member in members:
            if member.poll() is None:
                member.kill()
        for session in made:
            if any(d.exists() for d in session.directories):
                session.remove()
        for parent in parents:
            if parent.is_dir():
                parent.rmdir()


def test_a_sessions_frame_decodes_to_the_sessions_found_below_its_directories(tmp_path: Path) -> None:
    (tmp_path / "m" / "session-a").mkdir(parents=True)
    (tmp_path / "u" / "session-a").mkdir(parents=True)
    (tmp_path / "u" / "session-a" / "cgroup.kill").write_text("")
    (tmp_path / "m" / "not-a-directory").write_text("")
    body = guardian.encode([], [], (str(tmp_path / "m"), str(tmp_path / "u"), str(tmp_path / "gone")))
    directories, kill_files = guardian.decode_last(frame(body)) or ([], [])
    assert directories == [str(tmp_path / "m" / "session-a"), str(tmp_path / "u" / "session-a")]
    assert kill_files == [str(tmp_path / "u" / "session-a" / "cgroup.kill")]


def test_a_member_listed_as_0_is_never_signalled(tmp_path: Path) -> None:
    """cgroup.procs lists a member outside the reader's PID namespace as 0; kill(0, SIGKILL) would
    kill the reader's own process group (the daemon with it). Both readers of the file drop it."""
    for name, listed in (("a", "0\n4194304\n"), ("b", "0\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "cgroup.procs").write_text(listed)
    directories = [tmp_path / "a", tmp_path / "b"]
    assert guardian.members([str(d) for d in directories]) == [4194304]
    assert cgroups.CgroupV1(*directories, tmp_path / "c", None).members() == [4194304]
