"""Run a LaunchPlan: cgroup, guardian, fork, the child's setup in a fixed order, wait, typed outcome.

Child order (each step needs the privileges the next one removes):
  1. join the session cgroup            (needs write access to cgroup.procs)
  2. unshare mount + network namespaces (needs CAP_SYS_ADMIN); with an egress filter, join the
     network namespace it prepared instead of a new empty one
  3. private mounts, denied-path masks  (needs the new mount namespace)
  4. loopback up                        (needs CAP_NET_ADMIN in the new network namespace)
  5. drop uid/gid and every capability
  6. Landlock (sets no_new_privs); with a creation guard, first an outer domain that adds read
     access to /proc, then the guard is forked, then the agent's own domain nested inside
  7. seccomp                            (last: it forbids mount and unshare); its notification
                                        listener is handed to the guard
then exec. The parent is a child subreaper, so double-forked processes stay its children, and a
guardian process removes the cgroup (killing everything in it) if the parent dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import select
import signal
import socket
import subprocess
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson

from . import cgroups, creation_guard, landlock, namespaces, seccomp
from .plan import LaunchPlan

Reason = Literal["exit", "signal", "oom", "timeout", "pids_limit"]
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
_libc = ctypes.CDLL(None, use_errno=True)


class LaunchError(Exception):
    """Setting up the sandbox failed; nothing ran."""


@dataclass(frozen=True)
class Outcome:
    reason: Reason
    exit_code: int  # what adl-exec exits with: the child's code, or 128 + signal
    signal: int | None
    duration_s: float
    pid: int
    guard_refusals: list[dict[str, object]] = dataclasses.field(default_factory=list)
    guard_refused_total: int = 0


@dataclasses.dataclass(frozen=True)
class _Guard:
    """What the child needs to start the creation guard (prepared in the parent)."""

    syscall_names: dict[int, str]
    report_fd: int
    denied: Callable[[str], str | None]


def run(
    plan: LaunchPlan,
    session: str,
    *,
    uid: int | None = None,
    gid: int | None = None,
    cgroup_root: str = "/sys/fs/cgroup",
    cgroup_group: str = cgroups.GROUP,
    netns_fd: int | None = None,
) -> Outcome:
    """Run the plan's command in a new session cgroup. With netns_fd the agent joins that network
    namespace (the egress filter's); without it, it gets a new, empty one."""
    try:
        group = cgroups.create(session, Path(cgroup_root), group=cgroup_group)
        group.apply(plan.limits)
    except OSError as exc:
        raise LaunchError(f"cgroup setup failed: {exc}") from exc
    bpf = seccomp.compile_filter(plan.seccomp)
    guardian_pid, guardian_pipe = _start_guardian(group)
    _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    err_read, err_write = os.pipe2(os.O_CLOEXEC)
    report_read, report_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
    guard = (
        _Guard(seccomp.guarded_syscall_numbers(), report_write, plan.creation_denied)
        if plan.seccomp.guard_creation and plan.creation_denied is not None
        else None
    )
    try:
        started = time.monotonic()
        try:
            child = subprocess.Popen(
                plan.argv,
                executable=plan.executable,
                env=plan.env,
                preexec_fn=lambda: _child_setup(plan, bpf, guard, group.join_files(), uid, gid, err_write, netns_fd),
                start_new_session=True,
                close_fds=True,
            )
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(err_write)
            err_write = -1
            detail = os.read(err_read, 4096).decode(errors="replace").strip()
            raise LaunchError(f"sandbox setup failed in the child: {detail or exc}") from exc
        os.close(err_write)
        err_write = -1
        os.close(report_write)
        report_write = -1
        outcome = _wait(child, group, plan.timeout_s, started)
        outcome = _with_guard_report(outcome, report_read)
    finally:
        for fd in (err_write, report_write):
            if fd >= 0:
                os.close(fd)
        os.close(err_read)
        os.close(report_read)
        try:
            group.remove()
        finally:
            os.close(guardian_pipe)
            os.waitpid(guardian_pid, 0)
            _reap_orphans()
    return outcome


def _wait(child: subprocess.Popen[bytes], group: cgroups.Cgroup, timeout_s: float | None, started: float) -> Outcome:
    forward = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in forward:
        signal.signal(sig, lambda signum, _frame: _signal_child(child, signum))
    timed_out = False
    try:
        if not _exited_within(child.pid, timeout_s):
            timed_out = True
            group.kill_all()
        status = child.wait()
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)
    duration = time.monotonic() - started
    counters = group.counters()
    group.kill_all()  # the session ends with its main process: no stragglers
    sig = -status if status < 0 else None
    code = 128 + sig if sig is not None else status
    reason: Reason
    if timed_out:
        reason = "timeout"
    elif counters.oom_kills:
        reason = "oom"
    elif counters.pids_max_hits and status != 0:
        reason = "pids_limit"
    elif sig is not None:
        reason = "signal"
    else:
        reason = "exit"
    return Outcome(reason, code, sig, duration, child.pid)


def _exited_within(pid: int, timeout_s: float | None) -> bool:
    """Wait on a pidfd: Popen.wait(timeout) polls with growing sleeps, which added up to a
    millisecond to every short session."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    pidfd = os.pidfd_open(pid)
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        while True:
            left_ms = None if deadline is None else max(int((deadline - time.monotonic()) * 1000), 0)
            if poller.poll(None if left_ms is None else min(left_ms, 86_400_000)):
                return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
    finally:
        os.close(pidfd)


def _with_guard_report(outcome: Outcome, report_read: int) -> Outcome:
    """Add what the creation guard refused (it is dead by now: the session's cgroup was killed)."""
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(report_read, 65536):
            data += chunk
    refusals: list[dict[str, object]] = []
    total = 0
    for line in data.splitlines():
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a line cut by the kill
        if event.get("summary"):
            total = max(total, int(event.get("refused", 0)))
        else:
            refusals.append(event)
    total = max(total, len(refusals))
    return dataclasses.replace(outcome, guard_refusals=refusals, guard_refused_total=total)


def _signal_child(child: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(child.pid, signum)


def _reap_orphans() -> None:
    """As a subreaper we inherit double-forked processes; collect what the cgroup kill left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _start_guardian(group: cgroups.Cgroup) -> tuple[int, int]:
    """A process that waits for the launcher to die and then removes the session cgroup (killing
    everything in it). Returns its pid and the pipe end whose closing releases it."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # guardian
        try:
            os.close(write_end)
            os.closerange(3, read_end)  # hold nothing of the session open (the agent's network namespace)
            os.closerange(read_end + 1, 1 << 16)
            os.setsid()
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            while os.read(read_end, 1):
                pass
            group.remove(timeout=10)
        finally:
            os._exit(0)
    os.close(read_end)
    return pid, write_end


def _child_setup(
    plan: LaunchPlan,
    bpf: bytes,
    guard: _Guard | None,
    join_files: list[str],
    uid: int | None,
    gid: int | None,
    err_fd: int,
    netns_fd: int | None,
) -> None:
    """Runs in the forked child, single-threaded, before exec. Any failure is written to err_fd and
    raised, so Popen fails and nothing runs unsandboxed."""
    step = "start"
    try:
        step = "join cgroup"
        for path in join_files:
            with open(path, "w") as f:
                f.write("0")
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        step = "unshare"
        if netns_fd is None:
            namespaces.unshare(namespaces.CLONE_NEWNS | namespaces.CLONE_NEWNET)
        else:
            namespaces.unshare(namespaces.CLONE_NEWNS)
            step = "join the egress namespace"
            namespaces.setns(netns_fd, namespaces.CLONE_NEWNET)
        step = "mounts"
        namespaces.make_mounts_private()
        for path in plan.file_masks:
            namespaces.mask_file(path)
        for path in plan.dir_masks:
            namespaces.mask_dir(path)
        step = "loopback"
        namespaces.loopback_up()
        step = "drop privileges"
        namespaces.drop_privileges(uid, gid)
        rules = dataclasses.replace(plan.landlock, rules=list(plan.landlock.rules))
        if plan.landlock.abi and plan.baseline.proc_self:
            rules.add(f"/proc/{os.getpid()}", landlock.READ)
        guard_socket = None
        if guard is not None:
            step = "creation guard"
            if plan.landlock.abi:  # the guard's domain: the agent's rules plus reading /proc
                outer = dataclasses.replace(rules, rules=list(rules.rules))
                outer.add("/proc", landlock.READ)
                landlock.restrict(outer)
            guard_socket = _fork_guard(guard)
        if plan.landlock.abi:
            step = "landlock"
            landlock.restrict(rules)
        else:
            _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # Landlock would have set it
        step = "seccomp"
        listener = seccomp.load(bpf, listener=guard_socket is not None)
        if guard_socket is not None:
            step = "creation guard"
            socket.send_fds(guard_socket, [b"L"], [listener])
            os.close(listener)
            if guard_socket.recv(2) != b"ok":
                raise OSError("the creation guard did not start")
            guard_socket.close()
    except BaseException as exc:
        message = f"{step}: {exc}"
        if not isinstance(exc, OSError):
            message += " " + traceback.format_exc(limit=2)
        os.write(err_fd, message.encode()[:4000])
        raise


def _fork_guard(guard: _Guard) -> socket.socket:
    """Double-fork the creation guard (it becomes the launcher's child, not the agent's) and return
    the socket on which it waits for the seccomp listener."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            if os.fork() == 0:
                _run_guard(theirs, guard)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    os.waitpid(pid, 0)
    return ours


def _run_guard(sock: socket.socket, guard: _Guard) -> None:
    code = 1
    try:
        _libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the agent (same uid) must not read or write its memory
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # never hold the agent's stdout open
        keep = sorted({sock.fileno(), guard.report_fd})
        os.closerange(3, keep[0])
        for low, high in zip(keep, [*keep[1:], 1 << 20], strict=True):
            os.closerange(low + 1, high)  # the Popen error pipe among them
        _, fds, _, _ = socket.recv_fds(sock, 16, 1)
        if not fds:
            return
        sock.send(b"ok")
        sock.close()
        creation_guard.Supervisor(fds[0], guard.denied, guard.syscall_names, guard.report_fd).serve()
        code = 0
    finally:
        os._exit(code)
