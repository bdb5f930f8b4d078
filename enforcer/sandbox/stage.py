"""Processes forked ahead of a launch, while the launcher is still small.

Once the policy code is imported the launcher holds tens of megabytes; forking it costs
milliseconds in page-table copies and copy-on-write faults on both sides. So `prepare()` creates the
session's cgroup and forks two processes early (adl-exec does it before its heavy imports, while
they run on the other core):

- the **guardian** (guardian.py's code, exec'd as a fresh small interpreter), which is told the session's cgroup
  and removes it (killing everything in it) when the launcher goes away, even by SIGKILL (a daemon
  session has none: the daemon's spawner made its cgroup and does that, see ParentWatches);
- the **stage**, which joins the session's cgroup at once (a task's first move between v1 memory
  cgroups waits for an RCU grace period: this keeps that wait off the launch path), then
  forks the init of the session's PID namespace and exits; init, adopted by the launcher, forks
  pid 2 (pidns.py). Pid 2 waits for its `StageOrder`, applies the rest of the sandbox to itself in
  a fixed order and execs the agent: it *becomes* the agent, so no fork is left on the launch path.
  A stage the daemon's spawner prepares before any order (`join_later`) joins no cgroup at birth:
  once the session exists, pid 2 moves init and itself into its cgroup, before it reads the order.
  Nor does one forked ahead by adl-exec, whose init is a small interpreter (pidns.py): pid 2 joins
  at once, init once its interpreter runs, and pid 2 checks that both did before the order's steps.

Stage order (each step needs the privileges the next one removes):
  1. join the session cgroup            (at birth; its limits are set before the order is sent)
     and fork into a new PID namespace  (at birth too; pid 2 carries on below; with a small
                                        init, pidns.py's, pid 2 and init join instead of the stage)
  2. unshare mount, IPC and network    (needs CAP_SYS_ADMIN); with an egress filter, join the
     network namespace it prepared instead of a new empty one
  3. private mounts, denied-path masks, (needs the new mount namespace)
     every mount noexec but the allowed executables and library directories
  4. loopback up                        (needs CAP_NET_ADMIN in the new network namespace)
  5. mount the PID namespace's own /proc, its mount tables masked
  6. drop uid/gid (never host root) and every capability
  7. Landlock (sets no_new_privs); with a creation guard, first an outer domain that adds read
     access to /proc, then the guard is forked, then the agent's own domain nested inside
  8. seccomp                            (last: it forbids mount and unshare); its notification
                                        listener is handed to the guard
then exec. Any failure is written back on the order socket and the stage exits: nothing runs
unsandboxed. On exec the socket (close-on-exec) reaches end of stream with nothing on it.

At load this module imports the sandbox modules the stage runs, so that the stage (forked after)
shares their pages with the launcher; pyseccomp and libseccomp load in the stage itself.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import pickle
import resource
import select
import signal
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..framing import FrameError, recv_frame, send_frame
from ..policy import patterns  # noqa: F401 - what a pickled creation guard order refers to
from ..quick_dataclass import dataclass

# What the stage runs, imported before it is forked: the stage and the session's PID-namespace init
# (a fork of the stage) then share these pages with the launcher, which needs them (and the guard's
# orjson) anyway, instead of each importing private copies.
from . import cgroups, creation_guard, execmounts, guardian, landlock, namespaces, pidns, seccomp

if TYPE_CHECKING:
    from collections.abc import Mapping

    from .creation_guard import DeniedNames
    from .execmounts import ExecMounts
    from .landlock import LandlockPlan
    from .seccomp import SeccompPlan

# The guardian's code as this process loaded it: a session's guardian runs what its launcher (or the
# daemon) started with, never what guardian.py holds later (an upgrade in place between a daemon's
# start and its restart, a write by whoever can write the installation).
GUARDIAN_CODE = Path(guardian.__file__).read_text(encoding="utf-8")

GO = b"G"  # the launcher's word that the stage may exec the agent
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_SET_DUMPABLE = 4
_MAX_FD = 1 << 20
_STDIO = 3


class StageError(Exception):
    """The stage could not set up the sandbox (the message says which step and why)."""


@dataclass(frozen=True)
class GuardOrder:
    """What the stage needs to start the creation guard; its report pipe travels as a descriptor."""

    syscall_names: dict[int, str]
    denied: DeniedNames


@dataclass(frozen=True)
class StageOrder:
    argv: list[str]
    executable: str
    env: dict[str, str]
    cwd: str
    file_masks: list[str]
    dir_masks: list[str]
    landlock: LandlockPlan
    proc_self: bool
    seccomp: SeccompPlan  # compiled by the stage, ahead when it can (see _compile_while_idle)
    uid: int | None
    gid: int | None
    join_netns: bool  # the egress filter's namespace travels as a descriptor
    guard: GuardOrder | None
    exec_mounts: ExecMounts | None = None  # every other mount becomes noexec


class Stage:
    """The stage forks the session's init and exits (pidns.py); init, adopted by the launcher (a
    child subreaper), is what the launcher then waits for. `pid` is init's once the stage has
    announced it, and the agent's wait status comes from init over the status pipe."""

    def __init__(self, pid: int, sock: socket.socket, status_read: int, stage_fd: int = -1) -> None:
        self.pid = pid
        self._stage_pid = pid
        # The stage's pidfd, taken while it is surely not reaped: its death is seen beside the status
        # pipe, whose other end init and pid 2 may hold from a stage killed before it announced init.
        self._stage_fd = stage_fd
        self.agent_pid: int | None = None  # the process that becomes the agent, as the host sees it
        self._started = False
        self._sock = sock
        self._status = status_read
        self._announced = False
        self._lost: str | None = None  # why init is unknown, once the stage is found gone without it

    def _adopt_init(self) -> None:
        """Read init's pid (the stage's own if it could not fork one). The stage exits once it has
        announced init; it is collected later (_collect_stage), not waited for before the order."""
        if self._announced:
            if self._lost is not None:  # for good: pid 2 may live on, but no order goes to it
                raise StageError(self._lost)
            return
        self._announced = True
        if not self._announcement_or_stage_end():
            self._lost = "the launch stage is gone before it announced the session's init"
            raise StageError(self._lost)
        pid = pidns.read_pid(self._status)
        if pid is None:
            self._lost = "the launch stage is gone before it forked the session's init"
            raise StageError(self._lost)
        self.pid = pid

    def _announcement_or_stage_end(self) -> bool:
        """Wait until the status pipe is readable or the stage has ended; False if the stage ended
        with nothing written. A stage killed between init's fork and its announcement leaves the
        pipe's write end to init (and it never reaches end of stream while init lives); init and
        pid 2 then end once the order socket is closed, and with the session's cgroup."""
        if self._stage_fd < 0:
            return True  # no pidfd: end of stream is the only sign
        poller = select.poll()
        poller.register(self._status, select.POLLIN)
        poller.register(self._stage_fd, select.POLLIN)
        ready = {fd for fd, _events in poller.poll()}
        if self._status in ready:
            return True
        # The stage writes its announcement before it exits: once it has exited, what it wrote is in the pipe.
        return _readable_now(self._status)

    def _collect_stage(self) -> None:
        if self._stage_pid != self.pid:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self._stage_pid, 0)
            self._stage_pid = self.pid
        self._close_stage_fd()

    def _close_stage_fd(self) -> None:
        if self._stage_fd >= 0:
            os.close(self._stage_fd)
            self._stage_fd = -1

    def start(self, order: StageOrder, netns_fd: int | None, report_fd: int | None) -> None:
        """Hand the stage its order and return once it has exec'd the agent; StageError if it failed.
        The launcher's stdio goes along: it is the agent's, whatever the stage inherited at its fork."""
        self.send(order, netns_fd, report_fd)
        self.go()

    def wait_announced(self) -> None:
        """Return once init and the future agent have announced themselves; StageError if the
        stage is gone before."""
        try:
            self._adopt_init()
            self._learn_agent_pid()
        except OSError as exc:
            raise StageError(f"the launch stage is gone: {exc}") from exc
        self._collect_stage()  # it exits once it has announced init

    def join(self, join_files: list[str]) -> None:
        """A stage prepared with join_later: its init and future agent move into the session's
        cgroup (`join_files`, its cgroup.procs files) before they read the order. Sent at once, so
        the move runs while the order is made; one that fails is reported when the order comes.
        A stage that cannot be told is ended (its socket closed): send() then fails."""
        try:
            send_frame(self._sock, os.fsencode("\0".join(join_files)))
        except (OSError, FrameError, ValueError):
            self._sock.close()

    def fileno(self) -> int:
        """The order socket: readable before the order only if the stage is gone."""
        return self._sock.fileno()

    def send(self, order: StageOrder, netns_fd: int | None, report_fd: int | None) -> None:
        """Hand the stage its order: it sets the sandbox up, then waits for go() before the exec
        (what must precede the agent's start, its launch record, is done meanwhile)."""
        fds = [0, 1, 2, *(fd for fd in (netns_fd, report_fd) if fd is not None)]
        try:
            self._adopt_init()
            if not self._started:
                self._learn_agent_pid()
            send_frame(self._sock, pickle.dumps(order, pickle.HIGHEST_PROTOCOL), fds)
        except (OSError, FrameError) as exc:
            self._sock.close()
            raise StageError(f"the launch stage is gone: {exc}") from exc

    def go(self) -> None:
        """Let the stage exec the agent and return once it has; StageError if it failed (before or
        after this call). Closing the socket instead (discard()) ends the stage without the exec."""
        try:
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # it failed: its reason is read
                self._sock.sendall(GO)
                self._sock.shutdown(socket.SHUT_WR)
            answer = b""
            try:
                while chunk := self._sock.recv(65536):
                    answer += chunk
            except ConnectionResetError:
                # It ended with the go unread, so without the exec: its reason, if it wrote one.
                answer = answer or b"the launch stage is gone before the agent's start"
        except OSError as exc:
            raise StageError(f"the launch stage is gone: {exc}") from exc
        finally:
            self._sock.close()
            if self._announced:
                self._collect_stage()  # long gone by the agent's exec
        if answer:
            raise StageError(answer.decode(errors="replace").strip())

    def ready(self) -> bool:
        """Whether the future agent has announced itself (or the stage is gone): send() would not
        wait for it."""
        if self._started:
            return True
        return _readable_now(self._sock.fileno())

    def _learn_agent_pid(self) -> None:
        """The future agent announces its host pid before it reads its order, so the pid is known
        before anything of the agent's can run."""
        data = b""
        while len(data) < pidns.PID.size and (chunk := self._sock.recv(pidns.PID.size - len(data))):
            data += chunk
        if len(data) != pidns.PID.size:
            raise StageError("the launch stage is gone before the agent's process announced itself")
        (pid,) = pidns.PID.unpack(data)
        self.agent_pid = pid if pid > 0 else None
        self._started = True

    def session_pids(self) -> tuple[int, ...]:
        """Host pids that are the session's for its whole life: its init and the agent's process
        (the same one without a PID namespace). Empty before the launch."""
        if not self._started:
            return ()
        return (self.pid,) if self.agent_pid is None else (self.pid, self.agent_pid)

    def agent_status(self) -> int | None:
        """The agent's wait status as init reported it (None if init died first). Call once init
        has been waited for: every holder of the pipe's other end is gone by then."""
        return pidns.read_status(self._status)

    def discard(self) -> None:
        """Unused: the stage sees end of stream and exits without running anything. Once started,
        the launcher has waited for the session: only the status pipe is left to close."""
        if self._sock.fileno() >= 0:
            self._sock.close()
            with contextlib.suppress(StageError):
                self._adopt_init()
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
        if self._announced:
            self._collect_stage()
        self._close_stage_fd()
        if self._status >= 0:
            os.close(self._status)
            self._status = -1


class Guardian:
    """The process that removes the session's cgroup when the launcher goes (guardian.py)."""

    def __init__(self, pid: int, sock: socket.socket) -> None:
        self.pid = pid
        self._sock = sock
        self._running = False

    def watch(self, group: cgroups.Cgroup) -> None:
        send_frame(self._sock, guardian.encode([str(d) for d in group.directories], group.kill_files()))

    def watch_sessions(self, parents: list[Path]) -> None:
        """Every session below `parents` (the daemon's spawner: see guardian.py)."""
        send_frame(self._sock, guardian.encode([], [], tuple(str(p) for p in parents)))

    def fileno(self) -> int:
        return self._sock.fileno()

    def confirm(self, timeout_s: float = 30.0) -> None:
        """Return once the guardian runs; OSError if it could not start. Nothing of the agent's may
        run unguarded: the launcher asks before it starts the agent."""
        if self._running:
            return
        self._sock.settimeout(timeout_s)
        try:
            answer = self._sock.recv(len(guardian.READY))
        except TimeoutError as exc:
            raise OSError("the session's guardian did not start in time") from exc
        except OSError as exc:  # a reset: it is gone with the launcher's frame unread
            raise OSError(f"the session's guardian did not start: {exc.strerror or exc}") from exc
        finally:
            self._sock.settimeout(None)
        if answer != guardian.READY:
            raise OSError("the session's guardian did not start")
        self._running = True

    def release(self) -> None:
        """The launcher is done (its cgroup is gone): the guardian removes what is left and exits.
        Not waited for here: `reap()` collects it, off the launch path."""
        if self._sock.fileno() >= 0:
            self._sock.close()

    def reap(self) -> None:
        self.release()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


class ParentWatches:
    """In place of a guardian, in a daemon session's supervisor: the session's cgroup was made by
    the supervisor's parent, the daemon's spawner, which kills and removes it once the supervisor
    ends, however it ends (and whose own guardian does so for every session if the spawner dies).
    Nothing to start, confirm or release here."""

    def confirm(self, timeout_s: float = 30.0) -> None:
        return None

    def release(self) -> None:
        return None

    def reap(self) -> None:
        return None


@dataclass(frozen=True)
class Prepared:
    session: str
    stage: Stage
    guardian: Guardian | ParentWatches
    group: cgroups.Cgroup | None
    cgroup_error: str | None  # why there is no group: reported when the launch is attempted
    refusal: str | None = None  # why the launch must be refused, found before the stage was forked

    def discard(self) -> None:
        """Let go of what a launch did not use, and collect the guardian (safe after a launch too)."""
        self.stage.discard()
        self.guardian.reap()


def new_session_id() -> str:
    return "session-" + os.urandom(8).hex()  # secrets.token_hex's bytes, without importing random


def prepare(
    session: str,
    cgroup_root: str = "/sys/fs/cgroup",
    cgroup_group: str = cgroups.GROUP,
    *,
    ahead: bool = True,
    made_by_parent: tuple[cgroups.Cgroup | None, str | None] | None = None,
    join_later: bool = False,
    signal_mask: frozenset[int] | None = None,
    small_init: bool | None = None,
    agent_limits: Mapping[int, tuple[int, int]] | None = None,
    refusal: str | None = None,
) -> Prepared:
    """Create the session's cgroup and fork its guardian and stage. `ahead`: the order will come
    later, so the stage builds the seccomp programs meanwhile (a launcher forking on the launch path
    builds its one program before forking instead). `made_by_parent`: the session's cgroup (or why
    there is none) as the daemon's spawner made it, which watches it (see ParentWatches): no
    guardian is forked. `join_later`: a stage prepared before its session exists (the daemon's
    prepared sessions): it joins no cgroup at birth, and its init and future agent move into the
    session's when Stage.join() names it, which must precede the order. `signal_mask`: the signals
    the stage, init and the agent start blocked with, when the caller blocks some only for itself
    (a mask survives exec: the agent would start with them blocked); None: the caller's.
    `small_init`: the session's init is exec'd as a small interpreter of its own (pidns.py) rather
    than staying a fork of the stage; by default for a stage forked ahead by a launcher of its own
    (its start-up then overlaps the launcher's; a daemon session's init is a fork of a supervisor
    that holds little of its own). Not with `join_later`, whose pid 2 moves a forked init itself.
    `agent_limits`: resource limits (resource.RLIMIT_*: soft, hard) the agent gets, set by pid 2
    after it forked the creation guard: the caller's, which this process lifted for itself and for
    the stage, init and the guard (command_start.lift_limits). `refusal`: why the launch must be
    refused (its reason then), found by the caller before the stage is forked."""
    if small_init is None:
        small_init = ahead and made_by_parent is None and not join_later
    if small_init and join_later:
        raise ValueError("a small init joins the session's cgroup at birth: not with join_later")
    watcher: Guardian | ParentWatches
    group, error = None, None
    if made_by_parent is not None:
        watcher = ParentWatches()
        group, error = made_by_parent
    else:
        watcher = Guardian(*_fork(_exec_guardian))
        try:
            group = cgroups.create(session, Path(cgroup_root), group=cgroup_group)
            watcher.watch(group)
        except (OSError, FrameError) as exc:
            error = str(exc)
    join_files = group.join_files() if group is not None else []
    pidns.LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # init outlives the stage: ours to wait for
    status_read, status_write = os.pipe2(os.O_CLOEXEC)
    main = functools.partial(
        _stage_main,
        join_files=join_files,
        compile_ahead=ahead,
        status_fd=status_write,
        join_later=join_later,
        signal_mask=signal_mask,
        small_init=small_init,
        agent_limits=dict(agent_limits or {}),
    )
    pid, sock = _fork(main)
    os.close(status_write)
    try:
        stage_fd = os.pidfd_open(pid)  # not reaped before Stage collects it: the pid is still the stage's
    except OSError:
        # Without it a stage killed before it announced init would leave the launch waiting for good.
        sock.close()
        os.close(status_read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        watcher.reap()  # a guardian removes the session's cgroup once released
        raise
    return Prepared(session, Stage(pid, sock, status_read, stage_fd), watcher, group, error, refusal)


def _readable_now(fd: int) -> bool:
    # poll, not select(): the descriptor may be numbered above 1023 (a busy daemon, a caller's descriptors)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def _fork(main: Any) -> tuple[int, socket.socket]:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            os.setsid()  # out of the terminal's process group: the launcher forwards signals itself
            main(theirs)
            code = 0
        except BaseException:  # a forked child must never return into the caller's code
            with contextlib.suppress(Exception):
                import traceback  # only when a child fails

                traceback.print_exc()
        finally:
            os._exit(code)
    theirs.close()
    return pid, ours


def _exec_guardian(sock: socket.socket) -> None:
    """Become the guardian: a fresh interpreter, without site or environment, running GUARDIAN_CODE
    (a fork would keep private copies of the launcher's pages for the whole session)."""
    fd = sock.fileno()
    close_all_but({0, 1, 2, fd})  # hold nothing of a session open (an agent's namespace)
    os.set_inheritable(fd, True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.execv(sys.executable, [sys.executable, "-S", "-I", "-c", GUARDIAN_CODE, str(fd)])


def _stage_main(
    sock: socket.socket,
    join_files: list[str],
    compile_ahead: bool,
    status_fd: int,
    join_later: bool = False,
    signal_mask: frozenset[int] | None = None,
    small_init: bool = False,
    agent_limits: dict[int, tuple[int, int]] | None = None,
) -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if signal_mask is not None:  # before init and the future agent are forked: they inherit it
        signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
    _normal_scheduling()
    # Loaded now, while the launcher compiles the policy, not on the launch path; and before joining
    # the session's cgroup, so the session is not charged for them.
    import traceback  # noqa: F401 - for failure reports, which may come after Landlock is applied

    seccomp.pyseccomp()  # with libseccomp: the module loads them on first use

    join_error = None
    try:
        if not small_init:  # else pid 2 and the small init join (pidns.fork_init)
            for path in join_files:
                with open(path, "w") as f:
                    f.write("0")
    except OSError as exc:
        join_error = exc  # reported when the order comes: nothing runs outside the session's cgroup
    joined = _joined_already
    try:
        # Ahead of the order; returns in the future agent.
        joined = pidns.fork_init(status_fd, join_files if small_init else None)
    except OSError as exc:
        pidns.announce(status_fd, os.getpid())  # no namespace: the launcher waits for this process
        join_error = join_error or exc
    try:
        agent_pid = pidns.host_pid()
    except (OSError, ValueError, IndexError):
        agent_pid = 0  # unknown: the session's cgroup is then the only way to attribute its denials
    with contextlib.suppress(OSError):  # the launcher waits for it before it sends the order
        sock.sendall(pidns.PID.pack(agent_pid))
    if compile_ahead:
        _compile_while_idle(sock)
    if join_later:
        try:
            named = recv_frame(sock)
        except (OSError, FrameError):
            return
        if named is None:
            return  # discarded before its session existed
        join_error = join_error or _join_with_init(named[0])
    try:
        frame = recv_frame(sock, max_fds=5)
    except (OSError, FrameError):
        return
    if frame is None:
        return  # discarded
    data, fds = frame
    step = "join cgroup"
    try:
        if join_error is not None:
            raise join_error
        joined()
        step = "start"
        order: StageOrder = pickle.loads(data)
        step = "descriptors"
        stdio, extra = fds[:_STDIO], fds[_STDIO:]
        netns_fd = extra.pop(0) if order.join_netns else None
        report_fd = extra.pop(0) if order.guard is not None else None
        kept = [fd for fd in (netns_fd, report_fd) if fd is not None]
        for fd in kept:
            os.set_inheritable(fd, False)  # never handed to the agent
        for target, fd in enumerate(stdio):
            if fd == target:  # dup2 onto itself changes nothing: close-on-exec would stay
                os.set_inheritable(fd, True)
            else:
                os.dup2(fd, target)
        close_all_but({0, 1, 2, sock.fileno(), *kept})
        step = "cwd"
        os.chdir(order.cwd)
        _apply(order, netns_fd, report_fd, agent_limits or {})
        step = "exec"
        if sock.recv(len(GO)) != GO:
            os._exit(125)  # the launcher let go before the agent's start: nothing runs
        for sig in (signal.SIGPIPE, signal.SIGXFSZ):
            signal.signal(sig, signal.SIG_DFL)  # Python ignores these; an ignored signal survives exec
        os.execve(order.executable, order.argv, order.env)
    except _StepFailed as exc:
        _report_failure(sock, exc.step, exc.__cause__)
    except BaseException as exc:  # reported to the launcher, then the stage exits
        _report_failure(sock, step, exc)


def _normal_scheduling() -> None:
    """The normal policy for the session's processes, forked from here, whatever the launcher's: a
    real-time one (chrt) survives fork and exec, and cpu.max, which enforces max_cpu_percent,
    throttles only normal tasks (a kernel with real-time group scheduling refuses the cgroup join
    instead). The caller's nice value is kept: cpu.max binds at any."""
    if os.sched_getscheduler(0) not in (os.SCHED_OTHER, os.SCHED_BATCH, os.SCHED_IDLE):  # reset-on-fork too
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))


def _join_with_init(named: bytes) -> OSError | None:
    """Move init, then this process (the future agent), into the session's cgroup: the
    cgroup.procs files in `named`, NUL-separated. Each process is named by its pid in this PID
    namespace, where init is 1 for as long as the namespace lives: no pid of the host's, which could
    name another process by then, is written. The error, if any, fails the order."""
    paths = [path for path in os.fsdecode(named).split("\0") if path]
    if os.getpid() != 2:  # 1 names init only in the session's own namespace
        return OSError(errno.ESRCH, "the future agent is not pid 2 of the session's PID namespace")
    if not paths:
        return OSError(errno.ENOENT, "no session cgroup was named to join")
    try:
        for path in paths:
            for pid in ("1", "0"):
                with open(path, "w") as f:
                    f.write(pid)
    except OSError as exc:
        return exc
    return None


def _joined_already() -> None:
    return None


def _compile_while_idle(sock: socket.socket) -> None:
    """Compile every seccomp variant until the order arrives: the stage is idle while adl-exec
    imports the policy code, and a compiled filter is then ready when the order names it."""
    order = select.poll()  # not select(): the socket may be numbered above 1023 (a caller's descriptors)
    order.register(sock, select.POLLIN)
    for plan in seccomp.variants():
        if order.poll(0):
            return
        seccomp.compile_filter(plan)


class _StepFailed(Exception):
    def __init__(self, step: str) -> None:
        self.step = step


def _report_failure(sock: socket.socket, step: str, exc: BaseException | None) -> None:
    message = f"{step}: {exc}"
    if exc is not None and not isinstance(exc, OSError):
        import traceback  # loaded by _stage_main before anything restricts the stage

        message += " " + "".join(traceback.format_exception(exc, limit=2))
    with contextlib.suppress(OSError):
        os.write(sock.fileno(), message.encode()[:4000])
    os._exit(125)


def _apply(order: StageOrder, netns_fd: int | None, report_fd: int | None, limits: dict[int, tuple[int, int]]) -> None:
    libc = pidns.LIBC
    step = "seccomp"
    try:
        bpf = seccomp.compile_filter(order.seccomp)  # a cache hit unless the order came at once
        # The directory entered by descriptor (order.cwd), by the path it has now: after the masks
        # it is entered again by that path, so a launch directory beneath a mask cannot reach what
        # the mask hides through relative paths.
        cwd_path, cwd_stat = os.getcwd(), os.stat(".")
        step = "unshare"
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        # Its own IPC namespace: System V queues, semaphores and shared memory and POSIX message
        # queues are named by keys no Landlock rule or mount sees, and would outlive the session.
        private = namespaces.CLONE_NEWNS | namespaces.CLONE_NEWIPC
        if netns_fd is None:
            namespaces.unshare(private | namespaces.CLONE_NEWNET)
        else:
            namespaces.unshare(private)
            step = "join the egress namespace"
            namespaces.setns(netns_fd, namespaces.CLONE_NEWNET)
            os.close(netns_fd)
        step = "mounts"
        namespaces.make_mounts_private()
        for path in order.file_masks:
            namespaces.mask_file(path)
        for path in order.dir_masks:
            namespaces.mask_dir(path)
        if order.exec_mounts is not None:
            step = "noexec mounts"
            execmounts.apply(order.exec_mounts)
        step = "working directory"
        os.chdir(cwd_path)
        now = os.stat(".")
        if (now.st_dev, now.st_ino) != (cwd_stat.st_dev, cwd_stat.st_ino):
            raise OSError(errno.EACCES, f"the working directory {cwd_path} is hidden by denied_paths or was replaced")
        step = "loopback"
        namespaces.loopback_up()
        step = "proc"
        namespaces.mount_proc(os.getpid())
        step = "core dumps"
        # The kernel writes a core file itself, past the creation guard and the denied patterns;
        # a hard limit of 0 cannot be raised again without privileges.
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        step = "drop privileges"
        namespaces.drop_agent_privileges(order.uid, order.gid)
        rules = replace(order.landlock, rules=list(order.landlock.rules))
        if order.landlock.abi and order.proc_self:
            rules.add(f"/proc/{os.getpid()}", landlock.READ)
        guard_socket, guard_forker = None, 0
        if order.guard is not None and report_fd is not None:
            step = "creation guard"
            if order.landlock.abi:  # the guard's domain: the agent's rules plus reading /proc
                outer = replace(rules, rules=list(rules.rules))
                outer.add("/proc", landlock.READ)
                landlock.restrict(outer)
            guard_socket, guard_forker = _fork_guard(order.guard, report_fd, rules if order.landlock.abi else None)
            os.close(report_fd)
        step = "resource limits"
        for which, limit in limits.items():  # lowered only: allowed without privileges
            resource.setrlimit(which, limit)
        if order.landlock.abi:
            step = "landlock"
            landlock.restrict(rules)
        else:
            libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)  # Landlock would have set it
        step = "seccomp"
        listener = seccomp.load(bpf, listener=guard_socket is not None)
        if guard_socket is not None:
            step = "creation guard"
            socket.send_fds(guard_socket, [b"L"], [listener])
            os.close(listener)
            started = guard_socket.recv(256).split()
            if started[:1] != [b"ok"]:
                raise OSError("the creation guard did not start")
            guard_socket.close()
            step = "seccomp (the creation guard's limits)"
            seccomp.load(seccomp.limits_shield([int(tid) for tid in started[1:]]), listener=False)
            os.waitpid(guard_forker, 0)  # collected before the exec: the agent inherits no child
    except BaseException as exc:
        raise _StepFailed(step) from exc


def _fork_guard(guard: GuardOrder, report_fd: int, agent_rules: LandlockPlan | None) -> tuple[socket.socket, int]:
    """Double-fork the creation guard (it becomes init's child, not the agent's) and return
    the socket on which it waits for the seccomp listener, and the pid of the process that forks
    it, to collect before the exec: its fork and exit (the teardown of a copy of this process's
    memory) then overlap the agent's Landlock and seccomp set-up instead of holding them up."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            if os.fork() == 0:
                _run_guard(theirs, guard, report_fd, agent_rules)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    return ours, pid


def _run_guard(sock: socket.socket, guard: GuardOrder, report_fd: int, agent_rules: LandlockPlan | None) -> None:
    code = 1
    try:
        pidns.LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the agent (same uid) must not read its memory
        creation_guard.forget_environment()
        null = os.open("/dev/null", os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # never hold the agent's stdout open
        close_all_but({0, 1, 2, sock.fileno(), report_fd})  # the stage's order socket among them
        _, fds, _, _ = socket.recv_fds(sock, 16, 1, socket.MSG_CMSG_CLOEXEC)
        if not fds:
            return
        supervisor = creation_guard.Supervisor(fds[0], guard.denied, guard.syscall_names, report_fd, agent_rules)
        # Its process and threads, as the agent's namespace numbers them: the agent's filter then
        # keeps prlimit off them (seccomp.limits_shield). Every thread the guard runs exists by now.
        tids = supervisor.wide.call(os.listdir, "/proc/self/task")
        sock.send(b" ".join([b"ok", *(tid.encode() for tid in tids)]))
        sock.close()
        supervisor.serve()
        code = 0
    finally:
        os._exit(code)


def close_all_but(keep: set[int]) -> None:
    """Close every descriptor not in `keep` (what a forked helper must not hold)."""
    low = 0
    for fd in sorted(keep):
        if low < fd:  # closerange(0, 0) becomes close_range(0, UINT_MAX): every descriptor
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, _MAX_FD)
