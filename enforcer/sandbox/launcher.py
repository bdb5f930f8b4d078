"""Run a LaunchPlan: cgroup, stage and guardian (see stage.py), wait, typed outcome.

The launcher never forks on the launch path: the stage forked ahead has forked the session's PID
namespace's init and exited, and init has forked the process that becomes the agent (pidns.py).
The launcher is a child subreaper: it adopts init, waits for it and reads the agent's status from
it. Nothing of the launcher is visible from that namespace. The guardian removes the cgroup
(killing everything in it) if the launcher dies, even by SIGKILL.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import os
import select
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import orjson

from ..quick_dataclass import dataclass
from . import cgroups, seccomp
from .stage import GuardOrder, Prepared, StageError, StageOrder, prepare

if TYPE_CHECKING:
    from .plan import LaunchPlan

Reason = Literal["exit", "signal", "oom", "timeout", "pids_limit"]
PR_SET_CHILD_SUBREAPER = 36
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
    cleanup_error: str | None = None  # the session's cgroup could not be removed here (the guardian retries)


def run(
    plan: LaunchPlan,
    session: str,
    *,
    prepared: Prepared | None = None,
    uid: int | None = None,
    gid: int | None = None,
    cgroup_root: str = "/sys/fs/cgroup",
    cgroup_group: str = cgroups.GROUP,
    netns_fd: int | None = None,
    before_agent: Callable[[], None] | None = None,
) -> Outcome:
    """Run the plan's command in a new session cgroup. `prepared`: the stage and guardian forked
    ahead (stage.prepare()); without it they are forked now. With netns_fd the agent joins that
    network namespace (the egress filter's); without it, it gets a new, empty one. `before_agent`:
    called once the stage has its order, while it sets the sandbox up; the agent starts only after
    it returns, and not at all if it raises (what it raises is raised)."""
    owned = prepared is None  # forked here, on the launch path: collected here too
    if prepared is None:
        seccomp.compile_filter(plan.seccomp)  # cached: the stage forked now inherits it
        prepared = prepare(session, cgroup_root, cgroup_group, ahead=False)
    elif prepared.session != session:
        raise ValueError(f"the stage was prepared for {prepared.session}, not {session}")
    refuse_if_refused(prepared)
    group = prepared.group
    try:
        if group is None:
            raise OSError(prepared.cgroup_error)
        group.apply(plan.limits)
    except OSError as exc:
        prepared.discard()
        if group is not None:
            group.remove()
        raise LaunchError(f"cgroup setup failed: {exc}") from exc
    guarded = plan.seccomp.guarded and plan.creation_denied is not None
    report_read, report_write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK) if guarded else (-1, -1)
    try:
        _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        order = StageOrder(
            argv=plan.argv,
            executable=plan.executable,
            env=plan.env,
            # This very directory, not its path again: the path could be swapped meanwhile.
            cwd=f"/proc/{os.getpid()}/cwd",
            file_masks=plan.file_masks,
            dir_masks=plan.dir_masks,
            landlock=plan.landlock,
            proc_self=plan.baseline.proc_self,
            seccomp=plan.seccomp,
            uid=uid,
            gid=gid,
            join_netns=netns_fd is not None,
            guard=GuardOrder(seccomp.guarded_syscall_numbers(), plan.creation_denied) if guarded else None,  # type: ignore[arg-type]
            exec_mounts=plan.exec_mounts,
        )
        try:
            prepared.guardian.confirm()
        except OSError as exc:
            # No guardian will remove the session's cgroup later: the stage, which may still be
            # joining it, is collected first, so that the removal below finds it for good.
            prepared.stage.discard()
            raise LaunchError(f"sandbox setup failed: {exc}") from exc
        try:
            prepared.stage.send(order, netns_fd, report_write if guarded else None)
            if before_agent is not None:
                try:
                    before_agent()
                except BaseException:
                    prepared.stage.discard()  # it ends at its exec, without it
                    raise
            started = time.monotonic()
            prepared.stage.go()
        except StageError as exc:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(prepared.stage.pid, 0)
            raise LaunchError(f"sandbox setup failed in the child: {exc}") from exc
        finally:
            if guarded:
                os.close(report_write)
        outcome = _wait(prepared.stage.pid, group, plan.timeout_s, started, prepared.stage.agent_status)
        if guarded:
            outcome = _with_guard_report(outcome, report_read)
    finally:
        if guarded:
            os.close(report_read)
        cleanup_error = None
        try:
            group.remove()
        except OSError as exc:  # the outcome is still reported; the guardian, released now, tries again
            cleanup_error = f"cgroup removal: {exc}"
        finally:
            prepared.guardian.release()
            if owned:
                prepared.discard()
            _reap_orphans()
    return dataclasses.replace(outcome, cleanup_error=cleanup_error) if cleanup_error else outcome


def _wait(
    pid: int, group: cgroups.Cgroup, timeout_s: float | None, started: float, agent_status: Callable[[], int | None]
) -> Outcome:
    """Wait for the session's init (`pid`); the outcome is the agent's status as init reported it,
    or init's own when it was killed first (a timeout, an OOM kill)."""
    forward = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    for sig in forward:
        signal.signal(sig, lambda signum, _frame: _signal_child(pid, signum))
    timed_out = False
    try:
        if not _exited_within(pid, timeout_s):
            timed_out = True
            group.kill_all()
        waited = os.waitpid(pid, 0)[1]
        reported = agent_status()
        status = os.waitstatus_to_exitcode(reported if reported is not None else waited)
    finally:
        for sig, handler in forward.items():
            signal.signal(sig, handler)
    duration = time.monotonic() - started
    counters = group.counters()
    group.kill_all()  # the session ends with its main process: no stragglers
    killed_by = -status if status < 0 else None
    code = 128 + killed_by if killed_by is not None else status
    reason: Reason
    if timed_out:
        reason = "timeout"
    elif counters.oom_kills:
        reason = "oom"
    elif counters.pids_max_hits and status != 0:
        reason = "pids_limit"
    elif killed_by is not None:
        reason = "signal"
    else:
        reason = "exit"
    return Outcome(reason, code, killed_by, duration, pid)


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


def refuse_if_refused(prepared: Prepared | None) -> None:
    """LaunchError if the caller found, before the stage was forked, that the launch must be refused
    (Prepared.refusal), after letting the stage and its cgroup go. Checked before anything is
    recorded or forked for the launch (run_session), and here again for callers that come straight."""
    if prepared is None or prepared.refusal is None:
        return
    group = prepared.group
    prepared.discard()
    if group is not None:
        group.remove()
    raise LaunchError(prepared.refusal)


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


def _signal_child(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)


def _reap_orphans() -> None:
    """As a subreaper we inherit double-forked processes; collect what the cgroup kill left."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
