"""What adl-exec and adl-enforcerd do first when run as commands, before they open or import
anything else.

Descriptors 0, 1 and 2 held open: adl-exec hands its 0-2 to the agent as its stdin, stdout and
stderr (to the stage, or to the daemon over the launch socket). Started with one of them closed, the
next descriptor it opened would take that number: its end of the guardian's socket, a stage
socket, its connection to the daemon or the session file, handed to the agent as if it were the
caller's terminal (and the guardian, root outside the sandbox, obeys the last frame written on its
socket). So a closed 0-2 is filled with /dev/null first, as setuid programs do.

No import from the working directory: root's processes (adl-exec's supervisor, the daemon, the
egress filter) and the caller's (`adl-exec --daemon`) import some modules only when they first need
them, which can be after the agent has started. `python -m` and `-c` put the working directory
first on `sys.path` (`-m` as its path, `-c` as `""`), and an agent may write there: a module it
planted would run outside the sandbox, as root. Those entries are dropped.

SIGCHLD at its default: a caller that ignored it (`signal(SIGCHLD, SIG_IGN)` survives exec) would
have the kernel reap every child at once, and each wait for the stage, the creation guard or the
session's init would find no child: the command ran, its end was never recorded.

No inherited interval timer: a timer armed with setitimer or alarm also survives exec, and its
signal (SIGALRM, SIGVTALRM, SIGPROF) ends the process by default: adl-exec's supervisor would die
with the agent started and its end unrecorded. Each is disarmed.

No inherited CPU-time or file-size limit for the enforcer's processes: RLIMIT_CPU and RLIMIT_FSIZE
survive exec too. adl-exec's supervisor, which reads every kernel denial of the session, would be
killed (SIGXCPU, then SIGKILL) by a flood of them or a long session; and the session's records would
stop at the file-size limit (EFBIG) while the agent runs: either way its end unrecorded. Embedded
adl-exec lifts both, and its soft RLIMIT_NOFILE to the hard one, before it forks anything
(`lift_limits`) and hands the caller's to the agent, whom they may be meant for (stage.prepare's
`agent_limits`).
"""

from __future__ import annotations

import os
import sys


def start_command() -> None:
    open_standard_streams()  # before anything is opened: 0-2 are what the agent gets
    drop_working_directory()
    reap_own_children()
    disarm_inherited_timers()


def disarm_inherited_timers() -> None:
    """Disarm the real, virtual and profiling interval timers (see above)."""
    import _signal

    for timer in (_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF):
        _signal.setitimer(timer, 0)


def reap_own_children() -> None:
    """Set SIGCHLD back to its default if it was inherited ignored (see above). The built-in
    `_signal`: `signal` would import enum for nothing on the launch path."""
    import _signal

    if _signal.getsignal(_signal.SIGCHLD) == _signal.SIG_IGN:
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)


def open_standard_streams() -> None:
    """Point each closed descriptor among 0, 1 and 2 at /dev/null (open ones are left alone)."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            # The lowest free number: this one, as every lower one is open by now.
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:  # cannot happen while the lower ones are open; never leave it elsewhere
                os.dup2(null, fd)
                os.close(null)


def trusted_import_path(path: list[str], working_directory: str) -> list[str]:
    """`path` without the entries that name the working directory (`""`, a relative entry, or the
    directory itself, by any spelling)."""
    return [entry for entry in path if entry and os.path.isabs(entry) and os.path.realpath(entry) != working_directory]


def drop_working_directory() -> None:
    try:
        working = os.path.realpath(os.getcwd())
    except OSError:
        working = ""  # deleted: relative entries are removed all the same
    sys.path[:] = trusted_import_path(sys.path, working)


# What lift_limits lifts, each with how its refusal names it.
LIFTED = {"RLIMIT_CPU": ("CPU-time", "s", "t"), "RLIMIT_FSIZE": ("file-size", "bytes", "f")}


def lift_limits() -> tuple[dict[int, tuple[int, int]], str | None]:
    """Lift this process's RLIMIT_CPU and RLIMIT_FSIZE, and its soft RLIMIT_NOFILE (see above).
    Returns the caller's limits, to give the agent back (only those changed), and why the launch
    must be refused: a hard limit stays unless this process has CAP_SYS_RESOURCE, and a supervisor
    it would stop cannot record the session's end. A soft limit is raised to its hard one in any
    case (no privilege needed)."""
    import resource

    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    callers: dict[int, tuple[int, int]] = {}
    refusals: list[str] = []
    for name, (what, unit, option) in LIFTED.items():
        which = getattr(resource, name)
        caller = resource.getrlimit(which)
        if caller == unlimited:
            continue
        callers[which] = caller
        try:
            resource.setrlimit(which, unlimited)
        except (OSError, ValueError):  # ValueError: Python's word for EPERM on a hard limit
            hard = caller[1]
            resource.setrlimit(which, (hard, hard))
            refusals.append(f"a hard {what} limit ({name}, {hard} {unit}; ulimit -H{option} unlimited lifts it)")
    # Descriptors: the soft limit only (the hard one is bounded by fs.nr_open, never unlimited). Too
    # few, and the supervisor's kernel-denial reader failed on its first import while the agent ran.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        callers[resource.RLIMIT_NOFILE] = (soft, hard)
    if not refusals:
        return callers, None
    return callers, (
        f"adl-exec was started with {' and '.join(refusals)} it cannot lift without CAP_SYS_RESOURCE: its "
        "supervisor would be stopped by it, the session's end unrecorded. Start it without; the policy's "
        "resource_limits bound the agent"
    )
