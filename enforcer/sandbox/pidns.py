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
(double-forked processes) would stay its zombies. When init exits the kernel kills everything left
in the namespace, so nothing outlives the session's main process. Init stays root, which an agent
of another uid cannot signal, trace or prlimit; the agent mounts its own /proc
(namespaces.mount_proc), where neither init nor any host process appears.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import struct

from .namespaces import CLONE_NEWPID, unshare

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what the launcher passes on
PR_SET_PDEATHSIG = 1
_STATUS = struct.Struct("i")
PID = struct.Struct("i")  # the agent's host pid, on the order socket
# One handle for the stage, init, the future agent and the creation guard, loaded before they are
# forked: each ctypes.CDLL() builds a function-pointer type of its own, private to the process.
LIBC = ctypes.CDLL(None, use_errno=True)


def fork_init(status_fd: int) -> None:
    """Unshare a PID namespace and fork its init; the calling stage announces init on `status_fd`
    and exits, and this returns in init's first child (pid 2), which keeps every descriptor.
    OSError only from before the fork: the caller is then still the stage, and nothing was forked."""
    unshare(CLONE_NEWPID)
    stage = os.pidfd_open(os.getpid())
    init = os.fork()
    if init:
        announce(status_fd, init)
        os._exit(0)  # init is adopted by the launcher
    try:
        _start_init(stage, status_fd)  # returns in pid 2 only
    except BaseException:  # never back into the stage's code as anything but pid 2
        os._exit(125)


def _start_init(stage: int, status_fd: int) -> None:
    target = _Target()
    _forward_to(target)  # before the fork: a signal in between is forwarded, not lost
    # Forked at once: the stage's exit (the teardown of its copy of the launcher's memory) then
    # overlaps the future agent's start instead of holding it up.
    agent = os.fork()
    if agent:
        # The stage's pidfd turns readable once it is a zombie, which is after its children were
        # handed to the launcher: only then may the parent-death signal be set (the hand-over
        # delivers it).
        poller = select.poll()
        poller.register(stage, select.POLLIN)
        poller.poll()
        os.close(stage)
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher gone: the session goes
        target.start(agent)
        _close_all_but({0, 1, 2, status_fd})  # the order socket, the launcher's guardian socket
        _init_loop(agent, status_fd)  # never returns
    os.close(stage)
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
