"""The session's own PID namespace: the agent sees only its session's processes, and no pid of the
launcher, the guardian or any host process can even be named (kill, prlimit, /proc).

CLONE_NEWPID applies to the caller's children only, so the stage, right after joining the session's
cgroup and before its order arrives (off the launch path), unshares it and forks init, announces
init's pid on the status pipe and exits. The launcher is a child subreaper, so init becomes its
child; only then does init fork pid 2, which waits for the order, applies the sandbox and execs:

  launcher
    init (pid 1 of the new namespace)   forwards signals, reaps orphans, reports the agent's status
      pid 2                             becomes the agent

The agent is not pid 1 because pid 1 ignores every signal it has no handler for, and orphans
(double-forked processes) would stay its zombies. For a stage forked ahead by a launcher of its own
(adl-exec), init then execs a small interpreter of its own (pidns_init.py): a fork would hold the
launcher's pages for the whole session. That init and pid 2 join the session's cgroup themselves
(the stage does not), init once its interpreter has started, which is not charged to the session.

When init exits the kernel kills everything left in the namespace, so nothing outlives the
session's main process. Init stays root, which an agent of another uid cannot signal, trace or
prlimit; the agent mounts its own /proc (namespaces.mount_proc), where neither init nor any host
process appears.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from . import pidns_init
from .namespaces import CLONE_NEWPID, unshare

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what the launcher passes on
PR_SET_PDEATHSIG = 1
_STATUS = struct.Struct("i")
PID = struct.Struct("i")  # the agent's host pid, on the order socket
# One handle for the stage, init, the future agent and the creation guard, loaded before they are
# forked: each ctypes.CDLL() builds a function-pointer type of its own, private to the process.
LIBC = ctypes.CDLL(None, use_errno=True)
# The small init's code as this process loaded it (as stage.GUARDIAN_CODE: never what the file holds
# later, after an upgrade in place).
INIT_CODE = Path(pidns_init.__file__).read_text(encoding="utf-8")


def fork_init(status_fd: int, join_files: Sequence[str] | None = None) -> Callable[[], None]:
    """Unshare a PID namespace and fork its init; the calling stage announces init on `status_fd`
    and exits, and this returns in init's first child (pid 2), which keeps every descriptor.
    OSError only from before the fork: the caller is then still the stage, and nothing was forked.
    `join_files`: the session's cgroup, which the caller has not joined: init is exec'd as the
    small init (pidns_init.py), and it and pid 2 join the cgroup through these files. Returns, in
    pid 2, what raises OSError unless both have joined: called before anything of the agent's runs.
    Without `join_files` (the caller joined), it returns at once."""
    unshare(CLONE_NEWPID)
    stage = os.pidfd_open(os.getpid())
    launcher = os.pidfd_open(os.getppid())
    joined_read, joined_write = os.pipe2(os.O_CLOEXEC) if join_files is not None else (-1, -1)
    init = os.fork()
    if init:
        announce(status_fd, init)
        os._exit(0)  # init is adopted by the launcher
    try:
        if join_files is None:
            _start_init(stage, launcher, status_fd)  # returns in pid 2 only
            return _joined_before
        own = _start_small_init(stage, launcher, status_fd, (joined_read, joined_write), list(join_files))  # pid 2 only
    except BaseException:  # never back into the stage's code as anything but pid 2
        os._exit(125)
    return lambda: _both_joined(own, joined_read)


def _joined_before() -> None:
    return None


def _start_small_init(
    stage: int, launcher: int, status_fd: int, joined: tuple[int, int], join_files: list[str]
) -> OSError | None:
    """In init: fork pid 2, then exec the small init. Returns in pid 2 only, once it has joined the
    session's cgroup: the error of that join, or None."""
    joined_read, joined_write = joined
    # Blocked, not handled, until the small init has its handlers: blocked signals stay pending
    # across the exec, where a pid 1 without a handler would lose them.
    stage_mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    agent = os.fork()
    if agent:
        os.close(joined_read)
        _wait_for_exit(stage)  # as _start_init: the hand-over to the launcher would deliver the signal
        die_with(launcher)  # kept across the exec: same credentials
        _close_all_but({0, 1, 2, status_fd, joined_write})
        os.set_inheritable(status_fd, True)
        os.set_inheritable(joined_write, True)
        os.execv(
            sys.executable,
            [sys.executable, "-S", "-I", "-c", INIT_CODE, str(agent), str(status_fd), str(joined_write), *join_files],
        )
    os.close(stage)
    os.close(launcher)
    os.close(status_fd)
    os.close(joined_write)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, stage_mask)  # the stage's again: the agent inherits it
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # init gone: the session goes
    try:
        for path in join_files:
            with open(path, "w") as f:
                f.write("0")
    except OSError as exc:
        return exc
    return None


def _both_joined(own: OSError | None, joined_read: int) -> None:
    """Raise unless pid 2 (`own`: its join's error) and init have joined the session's cgroup; waits
    for init's word."""
    try:
        if own is not None:
            raise own
        answer = os.read(joined_read, 4096)
    finally:
        os.close(joined_read)
    if answer != pidns_init.JOINED:
        raise OSError(answer.decode(errors="replace") or "the session's init is gone before it joined its cgroup")


def die_with(launcher: int) -> None:
    """This process's parent-death signal, `launcher` being a pidfd of its parent taken before it
    was forked (or handed over) and closed here. The parent may have died before the signal was
    set: it would then be tied to whichever process adopted this one, which ends here instead.
    Init sets it after the hand-over; the egress filter at its start."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    poller = select.poll()
    poller.register(launcher, select.POLLIN)
    gone = bool(poller.poll(0))
    os.close(launcher)
    if gone:
        os._exit(125)  # the kernel then kills pid 2


def _wait_for_exit(pidfd: int) -> None:
    """The stage's pidfd turns readable once it is a zombie, which is after its children were
    handed to the launcher."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    poller.poll()
    os.close(pidfd)


def _start_init(stage: int, launcher: int, status_fd: int) -> None:
    target = _Target()
    _forward_to(target)  # before the fork: a signal in between is forwarded, not lost
    # Forked at once: the stage's exit (the teardown of its copy of the launcher's memory) then
    # overlaps the future agent's start instead of holding it up.
    agent = os.fork()
    if agent:
        # Only once the stage has handed its children to the launcher may the parent-death signal
        # be set (the hand-over delivers it).
        _wait_for_exit(stage)
        die_with(launcher)  # the launcher gone: the session goes
        target.start(agent)
        _close_all_but({0, 1, 2, status_fd})  # the order socket, the launcher's guardian socket
        _init_loop(agent, status_fd)  # never returns
    os.close(stage)
    os.close(launcher)
    os.close(status_fd)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # init gone: the session goes


def host_pid() -> int:
    """This process's pid in the PID namespace of the mounted /proc: the launcher's (the agent
    mounts its own /proc later), which is what the launcher and the kernel audit records see."""
    with open("/proc/self/status", encoding="ascii", errors="replace") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[1])
    return int(os.readlink("/proc/self"))


def announce(status_fd: int, pid: int) -> None:
    """Tell the launcher which process to wait for."""
    os.write(status_fd, _STATUS.pack(pid))


def read_pid(status_read: int) -> int | None:
    data = os.read(status_read, _STATUS.size)
    return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else None


def read_status(status_read: int) -> int | None:
    """The agent's wait status, once init (and with it every other holder of the pipe) is gone."""
    if status_read < 0:
        return None
    data = os.read(status_read, _STATUS.size)
    return _STATUS.unpack(data)[0] if len(data) == _STATUS.size else None


class _Target:
    """Where forwarded signals go; those that arrive before it exists are passed on once it does."""

    def __init__(self) -> None:
        self.pid = 0
        self.pending: list[int] = []

    def start(self, pid: int) -> None:
        self.pid = pid
        for signum in self.pending:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        self.pending.clear()


def _forward_to(target: _Target) -> None:
    def forward(signum: int, _frame: object) -> None:
        if target.pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(target.pid, signum)
        else:
            target.pending.append(signum)

    for sig in FORWARDED:
        signal.signal(sig, forward)


def _close_all_but(keep: set[int]) -> None:
    """What init must not hold: it outlives its launcher's descriptors otherwise (a guardian waits
    for the end of its socket)."""
    low = 0
    for fd in sorted(keep):
        if low < fd:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 1 << 20)


def _init_loop(agent: int, status_write: int) -> None:
    code = 1
    try:
        while True:
            pid, status = os.wait()  # orphans are reparented here: reap them too
            if pid == agent:
                os.write(status_write, _STATUS.pack(status))
                code = 0
                break
    finally:
        os._exit(code)  # the kernel then kills whatever is left in the namespace
