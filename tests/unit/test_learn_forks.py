"""Learn mode places a process that ended before its events were read (`git status` run by the
agent, read late on a loaded host) by the fork it came from, not by its /proc entry, which is gone."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterator

import pytest

from enforcer.sandbox import cgroups, fanotify, namespaces

from ..helpers.session_cgroup import session_cgroup

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and the process events connector need root")

GROUP = "adl-test-learn-forks"


@pytest.fixture
def session() -> Iterator[tuple[str, cgroups.Cgroup]]:
    with session_cgroup(GROUP) as made:
        yield made


def short_lived_child(join_files: list[str]) -> tuple[subprocess.Popen[str], int]:
    """A shell (in the cgroups given) that runs /bin/true, reaps it, says so and stays alive: the
    pid of the child that is gone, and the shell. It joins before it execs, as a session's processes
    do: a process the observer saw outside the session first is remembered as outside."""

    def join() -> None:
        for path in join_files:
            with open(path, "w") as f:
                f.write("0")

    shell = subprocess.Popen(
        ["sh", "-c", "/bin/true & echo $!; wait; echo reaped; exec sleep 30"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=join,
    )
    assert shell.stdout is not None
    child = int(shell.stdout.readline())
    assert shell.stdout.readline() == "reaped\n"
    assert not os.path.exists(f"/proc/{child}")
    return shell, child


def test_a_process_gone_before_its_events_are_read_is_placed_by_its_parent(
    session: tuple[str, cgroups.Cgroup],
) -> None:
    marker, group = session
    observer = fanotify.Observer(marker)
    inside = outside = None
    try:
        assert not observer.observed.forks_untracked
        inside, gone_inside = short_lived_child(group.join_files())
        outside, gone_outside = short_lived_child([])
        observer._members.clear()  # what the reading thread may have placed while they lived
        assert observer._member(gone_inside)  # placed by its parent, which is in the session
        assert not observer._member(gone_outside)
    finally:
        for shell in (inside, outside):
            if shell is not None:
                shell.kill()
                shell.wait()
        seen = observer.stop()
    assert os.path.realpath("/bin/true") in seen.executed


def test_without_fork_events_the_observer_says_so(session: tuple[str, cgroups.Cgroup]) -> None:
    """The connector answers only in the host's first network namespace: elsewhere (the tests'
    network lab) the observer still runs and says that it could miss processes that ended at once."""
    observed: list[fanotify.Observed] = []
    problems: list[BaseException] = []

    def in_a_namespace_of_its_own() -> None:
        try:
            namespaces.unshare(namespaces.CLONE_NEWNET)  # this thread only
            observed.append(fanotify.Observer(session[0]).stop())
        except BaseException as exc:
            problems.append(exc)

    thread = threading.Thread(target=in_a_namespace_of_its_own)
    thread.start()
    thread.join(30)
    assert not problems, problems
    assert observed[0].forks_untracked
