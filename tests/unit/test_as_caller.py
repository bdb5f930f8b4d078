"""The daemon's caller's working directory, looked up with the caller's credentials from a thread
(enforcer/sandbox/as_caller.py, through launching.enter_as_caller): what the caller cannot reach is
refused, root's groups and capabilities and this process's descriptors lend it nothing, nothing is
forked, and the process's own credentials are untouched."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer import launching
from enforcer.sandbox import as_caller

from ..helpers.sandbox import needs_root

pytestmark = needs_root
CALLER = (54321, 54321)  # an unprivileged account that owns nothing here
GROUP = 54322  # a group root is given below, never the caller


@pytest.fixture
def tree() -> Iterator[Path]:
    """public/ (0755), private/inside (0700 root), grouped/inside (0750 root:GROUP)."""
    root = Path(tempfile.mkdtemp(prefix=f"adl-as-caller-{os.getpid()}-"))
    try:
        root.chmod(0o755)
        for name, mode, gid in (("public", 0o755, 0), ("private", 0o700, 0), ("grouped", 0o750, GROUP)):
            (root / name / "inside").mkdir(parents=True)
            (root / name).chmod(mode)
            os.chown(root / name, 0, gid)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _in_child(check: Any) -> None:
    """Run `check` in a forked child (it changes this process's groups or directory); its failure
    fails the test."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            check()
            code = 0
        except BaseException as exc:
            print(f"{type(exc).__name__}: {exc}")
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def _thread_fs_credentials() -> tuple[str, str, str]:
    with open("/proc/thread-self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return fields["Uid"].split()[3], fields["Gid"].split()[3], fields.get("Groups", "").strip()


def test_a_directory_the_caller_can_reach_is_entered_without_a_fork(tree: Path, monkeypatch: Any) -> None:
    def no_fork() -> int:
        raise AssertionError("the lookup forked")

    def check() -> None:
        monkeypatch.setattr(os, "fork", no_fork)
        assert launching.enter_as_caller(str(tree / "public" / "inside"), *CALLER) == str(tree / "public" / "inside")

    before = _thread_fs_credentials()
    _in_child(check)
    assert _thread_fs_credentials() == before


def test_what_the_caller_cannot_reach_is_refused_whatever_root_may(tree: Path) -> None:
    def check() -> None:
        os.setgroups([GROUP])  # root's own groups lend the caller nothing
        credentials = _thread_fs_credentials()
        for name in ("private", "grouped"):
            with pytest.raises(PermissionError, match="not reachable as uid 54321"):
                launching.enter_as_caller(str(tree / name / "inside"), *CALLER)
        # The caller's own group does reach it.
        entered = launching.enter_as_caller(str(tree / "grouped" / "inside"), CALLER[0], GROUP)
        assert entered == str(tree / "grouped" / "inside")
        assert _thread_fs_credentials() == credentials  # this thread's are untouched
        assert os.getgroups() == [GROUP]

    _in_child(check)


def test_magic_links_to_this_process_s_directories_are_never_followed(tree: Path) -> None:
    def check() -> None:
        private = tree / "private" / "inside"
        os.chdir(private)  # the supervisor's own directory, behind a directory the caller cannot enter
        held = os.open(private, os.O_RDONLY | os.O_DIRECTORY)
        for magic in ("/proc/self/cwd", "/proc/thread-self/cwd", f"/proc/self/fd/{held}", f"/proc/{os.getpid()}/cwd"):
            with pytest.raises(PermissionError, match="not reachable"):
                launching.enter_as_caller(magic, *CALLER)
            assert os.getcwd() == str(private)

    _in_child(check)


def test_without_the_per_thread_lookup_a_child_looks_the_path_up(tree: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(as_caller, "_SYS_SETGROUPS", None)

    def check() -> None:
        with pytest.raises(PermissionError, match="not reachable as uid 54321"):
            launching.enter_as_caller(str(tree / "private" / "inside"), *CALLER)
        assert launching.enter_as_caller(str(tree / "public" / "inside"), *CALLER) == str(tree / "public" / "inside")

    _in_child(check)


@pytest.mark.parametrize("lookup", ["thread", "child"])
def test_a_directory_the_caller_may_name_but_not_enter_is_refused(tree: Path, monkeypatch: Any, lookup: str) -> None:
    """The caller reaches private/ and grouped/ themselves (their parent is 0755) but may not enter
    them (cd fails): the session, whose directory root enters, must not start there either. Root's
    own /root and init's /proc/1/fd likewise."""
    if lookup == "child":
        monkeypatch.setattr(as_caller, "_SYS_SETGROUPS", None)

    def check() -> None:
        for directory in (tree / "private", tree / "grouped", Path("/root"), Path("/proc/1/fd")):
            if directory == Path("/root") and directory.stat().st_mode & 0o001:
                continue  # a host whose /root anyone may enter
            with pytest.raises(PermissionError, match="not reachable as uid 54321"):
                launching.enter_as_caller(str(directory), *CALLER)
        assert launching.enter_as_caller(str(tree / "public"), *CALLER) == str(tree / "public")

    _in_child(check)


@pytest.fixture
def hidden_pids() -> Iterator[Path]:
    """A /proc of this PID namespace mounted with hidepid=2: another account's processes are not
    there for the caller (a common hardening of the host's /proc)."""
    import subprocess

    mount = Path(tempfile.mkdtemp(prefix=f"adl-as-caller-proc-{os.getpid()}-"))
    mount.chmod(0o755)
    subprocess.run(["mount", "-t", "proc", "-o", "hidepid=2", "proc", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)
        mount.rmdir()


def test_root_s_capabilities_lend_the_lookup_nothing(hidden_pids: Path) -> None:
    """Only the filesystem capabilities follow fsuid: the lookup must not keep root's others
    (CAP_SYS_PTRACE would show it the processes hidepid hides from the caller)."""

    def capabilities() -> str:
        with open("/proc/thread-self/status") as f:
            return next(line for line in f if line.startswith("CapEff:"))

    def check() -> None:
        before = capabilities()
        hidden = hidden_pids / str(os.getppid())  # root's, and not this process's own
        with pytest.raises(OSError):
            as_caller.open_directory(str(hidden), *CALLER)
        os.close(as_caller.open_directory(str(hidden_pids), *CALLER))  # what the caller does see
        assert capabilities() == before  # this thread keeps its own

    _in_child(check)


@pytest.mark.parametrize("lookup", ["thread", "child"])
def test_no_directory_of_proc_becomes_the_session_s(monkeypatch: Any, lookup: str) -> None:
    """The lookup thread shares this process's /proc entries, whose descriptors directory the same
    thread group may always enter: /proc/self/fd resolved to root's process though the caller
    cannot cd there. No /proc directory has a use as an agent's working directory (and the host's
    would stay its view of the host's processes under its own /proc): each is refused."""
    if lookup == "child":
        monkeypatch.setattr(as_caller, "_SYS_SETGROUPS", None)

    def check() -> None:
        for directory in ("/proc/self/fd", "/proc/thread-self/fd", "/dev/fd", "/proc", "/proc/self/task"):
            with pytest.raises(PermissionError, match="/proc"):
                launching.enter_as_caller(directory, *CALLER)
        assert launching.enter_as_caller("/usr", *CALLER) == "/usr"

    _in_child(check)


def test_a_directory_whose_name_is_not_utf8_is_refused_as_such(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The launch record holds the session's directory as text: a name that is not UTF-8 is refused
    by name, not as a failure of the audit log."""
    odd = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(odd)
    monkeypatch.chdir("/")
    with pytest.raises(PermissionError, match="not UTF-8"):
        launching.enter_as_caller(os.fsdecode(odd), os.getuid(), os.getgid())


def test_a_lookup_that_never_returns_refuses_the_launch_in_time_and_leaks_nothing(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A working directory on a mount that does not answer: the lookup's system call never returns.
    The wait for it held the launch (and its slot) for as long; now it is refused after
    LOOKUP_TIMEOUT_S, and the descriptor a late lookup opens is closed by the abandoned thread."""
    hung, opened = threading.Event(), []
    real_open = as_caller._open

    def hanging_open(path: str) -> int:
        hung.wait(30)  # the stand-in for a lookup blocked in the kernel, released below
        fd = real_open(path)
        opened.append(fd)
        return fd

    monkeypatch.setattr(as_caller, "_open", hanging_open)
    monkeypatch.setattr(as_caller, "LOOKUP_TIMEOUT_S", 0.3)
    before = set(os.listdir("/proc/self/fd"))
    started = time.monotonic()
    with pytest.raises(PermissionError, match=r"not reachable as uid 54321: its lookup did not return within 0.3 s"):
        launching.enter_as_caller(str(tree / "public" / "inside"), *CALLER)
    assert time.monotonic() - started < 5
    (lookup,) = [t for t in threading.enumerate() if t.name == "cwd-as-caller"]
    assert lookup.daemon, "a hung lookup must not keep its process from exiting"
    hung.set()  # the mount answers at last
    lookup.join(10)
    assert not lookup.is_alive() and len(opened) == 1
    assert set(os.listdir("/proc/self/fd")) == before, "the late descriptor was closed"
    assert os.getcwd() != str(tree / "public" / "inside")


def test_a_lookup_that_returns_within_the_limit_is_used(tree: Path) -> None:
    fd = as_caller.open_directory(str(tree / "public" / "inside"), *CALLER, timeout_s=5)
    try:
        assert os.path.samefile(f"/proc/self/fd/{fd}", tree / "public" / "inside")
    finally:
        os.close(fd)


def test_a_child_lookup_that_never_returns_refuses_the_launch_in_time_and_is_killed(
    tree: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same hung mount where the lookup runs in a child process (no per-thread lookup on this
    architecture): the launch is refused after LOOKUP_TIMEOUT_S and the child killed and collected,
    nothing of it left open."""
    monkeypatch.setattr(as_caller, "_SYS_SETGROUPS", None)
    monkeypatch.setattr(as_caller, "LOOKUP_TIMEOUT_S", 0.3)
    target = str(tree / "public" / "inside")

    def check() -> None:
        real_open = os.open

        def hanging_open(path: Any, *args: Any, **kw: Any) -> int:
            if path == target:
                time.sleep(20)  # the stand-in for a lookup blocked in the kernel
            return real_open(path, *args, **kw)

        os.open = hanging_open  # type: ignore[assignment]  # this forked check's copy only
        before = set(os.listdir("/proc/self/fd"))
        started = time.monotonic()
        try:
            launching.enter_as_caller(target, *CALLER)
        except PermissionError as exc:
            assert "not reachable as uid 54321: its lookup did not return within 0.3 s" in str(exc), exc
        else:
            raise AssertionError("the hung lookup was not refused")
        finally:
            os.open = real_open
        assert time.monotonic() - started < 5
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            pass  # the lookup's child was killed and collected
        else:
            raise AssertionError("the lookup's child is left")
        assert set(os.listdir("/proc/self/fd")) == before
        assert os.getcwd() != target

    _in_child(check)
