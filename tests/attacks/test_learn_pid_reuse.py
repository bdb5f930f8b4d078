"""Learn mode must not take a host process for the agent's when it gets a pid one of the session's
processes had: the agent can cycle pids (fork and exit) until a host process lands on one the
observer placed in the session, and that process's accesses would be learned as the agent's."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.sandbox import cgroups, fanotify

from ..helpers.session_cgroup import session_cgroup

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and ns_last_pid need root")

GROUP = "adl-test-learn-pid-reuse"
NS_LAST_PID = Path("/proc/sys/kernel/ns_last_pid")


@pytest.fixture
def session() -> Iterator[tuple[str, cgroups.Cgroup]]:
    with session_cgroup(GROUP) as made:
        yield made


def host_process_with_pid(pid: int) -> subprocess.Popen[bytes] | None:
    """A shell outside the session that got `pid` (ns_last_pid set just before its fork), waiting
    for a line on stdin; None when another process on the host took the pid first."""
    NS_LAST_PID.write_text(str(pid - 1))
    shell = subprocess.Popen(["sh", "-c", 'read line; exec cat "$line"'], stdin=subprocess.PIPE)
    if shell.pid == pid:
        return shell
    shell.kill()
    shell.wait()
    return None


def test_a_host_process_given_a_session_process_s_pid_is_not_learned_as_the_agent_s(
    session: tuple[str, cgroups.Cgroup], tmp_path: Path
) -> None:
    marker, group = session
    secret = tmp_path / f"host-only-{uuid.uuid4().hex}"
    secret.write_text("the host's\n")
    observer = fanotify.Observer(marker)
    host = None
    try:
        if observer.observed.forks_untracked:
            pytest.skip("no fork events here (not the host's first network namespace)")
        joins = "".join(f"echo $$ > {path}; " for path in group.join_files())
        inside = subprocess.Popen(["sh", "-c", f"{joins}exec sleep 30"])
        deadline = time.monotonic() + 10
        while not observer._member(inside.pid):  # placed in the session, as the reading thread does
            observer._members.pop(inside.pid, None)
            assert time.monotonic() < deadline, "the shell never joined the session's cgroup"
            time.sleep(0.01)
        reused = inside.pid
        inside.kill()
        inside.wait()
        for _ in range(50):  # other processes on the host may take the pid first
            host = host_process_with_pid(reused)
            if host is not None:
                break
        if host is None:
            pytest.skip(f"pid {reused} was always taken by another process first")
        assert host.stdin is not None
        host.stdin.write(f"{secret}\n".encode())
        host.stdin.close()
        assert host.wait(10) == 0
        time.sleep(0.3)  # the reading thread's next pass
    finally:
        if host is not None and host.poll() is None:
            host.kill()
            host.wait()
        seen = observer.stop()
    assert str(secret) not in seen.read


def test_a_gone_host_process_is_not_placed_by_a_session_process_that_took_its_parent_s_pid(
    session: tuple[str, cgroups.Cgroup],
) -> None:
    """The host's shell ran a short-lived child and ended; a session process then got the shell's
    pid. Read late, the child's events must not be placed by the process that has its parent's pid."""
    marker, group = session
    observer = fanotify.Observer(marker)
    inside = None
    try:
        if observer.observed.forks_untracked:
            pytest.skip("no fork events here (not the host's first network namespace)")
        shell = subprocess.Popen(
            ["sh", "-c", "/bin/true & echo $!; wait; echo reaped"], stdout=subprocess.PIPE, text=True
        )
        assert shell.stdout is not None
        gone = int(shell.stdout.readline())
        assert shell.stdout.readline() == "reaped\n"
        assert shell.wait(10) == 0
        joins = "".join(f"echo $$ > {path}; " for path in group.join_files())
        for _ in range(50):  # other processes on the host may take the pid first
            NS_LAST_PID.write_text(str(shell.pid - 1))
            inside = subprocess.Popen(["sh", "-c", f"{joins}exec sleep 30"])
            if inside.pid == shell.pid:
                break
            inside.kill()
            inside.wait()
            inside = None
        if inside is None:
            pytest.skip(f"pid {shell.pid} was always taken by another process first")
        deadline = time.monotonic() + 10
        while observer._in_session(inside.pid) is not True:
            assert time.monotonic() < deadline, "the shell never joined the session's cgroup"
            time.sleep(0.01)
        observer._members.clear()  # what the reading thread may have placed meanwhile
        assert not observer._member(gone)
    finally:
        if inside is not None:
            inside.kill()
            inside.wait()
        observer.stop()
