"""The session's own PID namespace: the agent sees only its session's processes, and no pid of the
launcher, the guardian or any host process can even be named (kill, prlimit, /proc).

CLONE_NEWPID applies to the caller's children only, so the stage, right after joining the session's
cgroup and before its order arrives (off the launch path), unshares it and forks:

  stage (host namespace, the launcher's child)  waits and ends as the agent did
    init (pid 1 of the new namespace)           forwards signals, reaps orphans, reports the status
      pid 2                                     waits for the order, applies the sandbox, execs

The agent is not pid 1 because pid 1 ignores every signal it has no handler for, and orphans
(double-forked processes) would stay its zombies. When init exits the kernel kills everything left
in the namespace, so nothing outlives the session's main process. Init and the stage stay root,
which an agent of another uid cannot signal, trace or prlimit; the agent mounts its own /proc
(namespaces.mount_proc), where neither they nor any host process appear.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import struct

from .namespaces import CLONE_NEWPID, unshare

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # what the launcher passes on
PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
_STATUS = struct.Struct("i")


def fork_init(close_in_helpers: list[int]) -> None:
    """Unshare a PID namespace, fork its init and pid 2; return in pid 2 only. `close_in_helpers`:
    descriptors the stage and init must not hold (the order socket: its end of stream tells the
    launcher the agent exec'd, or the stage that the launch was discarded)."""
    unshare(CLONE_NEWPID)
    status_read, status_write = os.pipe()
    target = _Target()
    _forward_to(target)  # before the fork: a signal in between is forwarded, not lost
    init = os.fork()
    if init:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # the launcher gone: all go
        target.start(init)
        os.close(status_write)
        _close(close_in_helpers)
        _end_like_agent(init, status_read)  # never returns
    target.pending.clear()  # the stage's, not init's
    os.close(status_read)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    agent = os.fork()
    if agent:
        target.start(agent)
        _close(close_in_helpers)
        _init_loop(agent, status_write)  # never returns
    os.close(status_write)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


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


def _close(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


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


def _end_like_agent(init: int, status_read: int) -> None:
    """The stage: wait for init, then exit with the agent's status (killed by the same signal when
    it was killed), so the launcher reads the agent's outcome from its own child."""
    code = 1
    try:
        _, init_status = os.waitpid(init, 0)
        data = os.read(status_read, _STATUS.size)
        status = _STATUS.unpack(data)[0] if len(data) == _STATUS.size else init_status
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the agent's crash, not the stage's
            ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
            for forwarded in FORWARDED:
                signal.signal(forwarded, signal.SIG_DFL)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):  # these cannot be caught nor blocked
                signal.signal(sig, signal.SIG_DFL)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
            os.kill(os.getpid(), sig)
            code = 128 + sig
        else:
            code = os.waitstatus_to_exitcode(status)
    finally:
        os._exit(code)
