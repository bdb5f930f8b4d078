"""A process that joins a session's cgroup after its last member was killed and before its
directory is removed: the small init of an adl-exec session (pidns_init.py) joins only once its
interpreter runs, so adl-exec killed during that start has its guardian kill an empty group that
init enters a moment later. The removal must kill it too and remove the group, or say it could
not: an rmdir that stays busy must never end quietly with the group and its member left."""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from enforcer.sandbox import cgroups, guardian

from ..helpers.processes import alive

ROOT = Path("/sys/fs/cgroup")
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not (ROOT / "pids" / "cgroup.procs").exists(), reason="needs root and cgroup v1 pids"
)


@contextlib.contextmanager
def _late_joiner(directory: Path) -> Iterator[Callable[[], int]]:
    """Yields what forks a process that joins `directory` and waits until it has: its pid. Every
    such process is killed and collected afterwards, and the directory removed."""
    started: list[int] = []

    def join() -> int:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(read)
                (directory / "cgroup.procs").write_text("0")
                os.write(write, b"j")
                signal.pause()
            finally:
                os._exit(0)
        os.close(write)
        started.append(pid)
        try:
            assert os.read(read, 1) == b"j", "the late joiner could not join"
        finally:
            os.close(read)
        return pid

    try:
        yield join
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        with contextlib.suppress(FileNotFoundError):
            directory.rmdir()


def _joins_once_seen_empty(
    members: Callable[..., list[int]], join: Callable[[], int], joined: list[int]
) -> Callable[..., list[int]]:
    """`members` that, the first time it finds the group empty, has a process join it before
    answering: the order of the race, made certain (the join itself is the kernel's)."""

    def wrapped(*args: object) -> list[int]:
        found = members(*args)
        if not found and not joined:
            joined.append(join())
        return found

    return wrapped


def test_the_guardian_kills_a_member_that_joins_before_the_rmdir(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = ROOT / "pids" / f"adl-atk-late-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    joined: list[int] = []
    with _late_joiner(directory) as join:
        monkeypatch.setattr(guardian, "members", _joins_once_seen_empty(guardian.members, join, joined))
        guardian.remove([str(directory)], [], timeout=5)
        assert joined, "the group was never seen empty"
        assert not directory.exists(), "the guardian left the group"
        assert not alive(joined[0]), "the guardian left a member alive"


def test_a_cgroup_removal_kills_a_member_that_joins_before_the_rmdir(monkeypatch: pytest.MonkeyPatch) -> None:
    directory = ROOT / "pids" / f"adl-atk-late-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    directory.mkdir()
    group = cgroups.CgroupV1(directory, directory, directory, None)
    group.directories = [directory]  # one hierarchy is enough to race
    joined: list[int] = []
    with _late_joiner(directory) as join:
        monkeypatch.setattr(group, "members", _joins_once_seen_empty(group.members, join, joined))
        group.remove(timeout=5)
        assert joined, "the group was never seen empty"
        assert not directory.exists(), "the removal left the group"
        assert not alive(joined[0]), "the removal left a member alive"
