"""The single-threaded spawner: forked by adl-enforcerd before any gRPC code is imported.

Forking from a process that runs gRPC threads crashes children, so every session is launched from
here. The daemon sends a launch order (orders.LaunchOrder, JSON) with the caller's stdin, stdout,
stderr and launch connection attached; the spawner forks one supervisor per session, which hands
it to the launch path embedded adl-exec uses too (enforcer/launching.py): the policy is compiled
again from the very documents the daemon checked (and refused if the digest differs), by the
spawner before the fork, once per set of documents and settings, and the session is audited
with the supervisor's own writer on the same log. The supervisor reports SessionEnded straight
to the caller; the spawner tells the daemon when each supervisor ends.

Prepared sessions (SpawnerConfig.prepared_sessions): the spawner keeps that many supervisors forked
before any order, each with its stage, the stage's init and the future agent forked and waiting
(stage.prepare with join_later), so that an order finds them made: the forks leave its path. They
hold nothing of a session: no id, no caller, no cgroup of a session (a session's cgroup is named by
its id, which the daemon draws with the order, and nothing but running sessions may be found in the
sessions' group); until an order they are in a cgroup of their own in the helpers' directory
(<cgroup_group>.helpers/prepared-<spawner pid>), under the bound on all helpers' tasks and one of
its own. Each order is handed whole to
the first one waiting (the order, the caller's descriptors, the cgroups made for it), over a
socket only the spawner and that supervisor hold, which is closed once the order is sent: no
prepared supervisor ever gets a second order, and one whose hand-over failed is killed, never
tried again. The supervisor then has the future agent move itself and init into the session's
cgroup before it reads its order, and goes on as a supervisor forked at the order. Supervisors
prepared before the spawner compiled an order's documents (which they would compile again) are
retired when that happens; they, or one that ends before its order, are replaced after a pause
that grows with each such retirement or end in a row. Refills wait until orders pause.

Both the spawner and each supervisor die with their parent (PR_SET_PDEATHSIG). The spawner makes
each session's cgroup before it forks the supervisor and kills and removes it when the supervisor
ends, however it ends (a supervisor has no guardian of its own); one guardian started by the
spawner (guardian.py) does the same for every session if the spawner dies.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import errno
import json
import logging
import os
import pickle
import resource
import select
import signal
import socket
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..audit import AuditUnavailable, AuditWriter, Entry, Receipt, WriterSettings, records
from ..framing import FrameError, recv_frame, send_frame
from .orders import (
    REFUSAL_COUNTED,
    REFUSAL_RECORDED,
    LaunchOrder,
    OrderError,
    SessionGone,
    SessionStarted,
    SpawnerConfig,
    SpawnerEvent,
    TerminateOrder,
    read_event,
    read_order,
    session_named,
)

if TYPE_CHECKING:
    from ..launching import Masks, PolicyDocuments, Result
    from ..sandbox.stage import Prepared, Stage

log = logging.getLogger(__name__)
PR_SET_PDEATHSIG = 1
HELPERS_SUFFIX = ".helpers"  # cgroup directory of the sessions' helpers: <cgroup_group>.helpers
# The tasks of all sessions together, as shares of the host's (cgroups.host_tasks): the unit sets
# no TasksMax, so without them sessions at their own limits, as many as callers start, could take
# every pid of the host. Agents and root helpers apart: one kind's flood leaves the other its share.
AGENTS_TASKS_SHARE = 0.4
HELPERS_TASKS_SHARE = 0.2
HELPER_PIDS = 128  # the supervisor's threads and children, and the egress filter's besides its connections
# The tasks of each prepared supervisor with its stage, init and future agent (a handful: the rest is
# room for one that has its order and has not moved into its session's cgroups yet).
PREPARED_PIDS = 16
_libc = ctypes.CDLL(None, use_errno=True)
# A prepared supervisor is forked once orders have paused this long: its forks would otherwise take
# the CPU the launch in progress needs.
REFILL_PAUSE_S = 0.05
# After a prepared supervisor could not be made, ended before its order or was retired, the next is
# forked after this pause, doubled for each such setback in a row up to the second figure: a host
# that kills them, or orders that each retire them, must not see a fork loop.
PREPARE_RETRY_S = (0.5, 60.0)
HAND_OVER_S = 5.0  # a prepared supervisor that does not take its order in this time is killed


def _die_with_parent(expected_parent: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


@dataclass
class SpawnerHandle:
    pid: int
    sock: socket.socket
    lock: threading.Lock

    def launch(self, order: LaunchOrder, fds: list[int], cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Send the order, unless `cancelled()` says the session was terminated meanwhile (asked
        under the same lock as terminate(), so one of the two always sees the other)."""
        with self.lock:
            if cancelled():
                return False
            send_frame(self.sock, order.to_json(), fds)
            return True

    def terminate(self, session: str, mark: Callable[[], None]) -> None:
        """Tell the session's supervisor to end it (SIGUSR1), after `mark()` under the launch lock."""
        with self.lock:
            mark()
            send_frame(self.sock, TerminateOrder(session).to_json())

    def events(self) -> Iterator[SpawnerEvent]:
        """Yield the spawner's reports until it goes away (or sends one that is not a report)."""
        while True:
            try:
                frame = recv_frame(self.sock)
            except (OSError, FrameError):
                return
            if frame is None:
                return
            try:
                yield read_event(frame[0])
            except OrderError as exc:
                log.error("the spawner sent a report that is not one (%s); its reports are no longer read", exc)
                return


def start(config: SpawnerConfig, close: list[int] | None = None) -> SpawnerHandle:
    """Fork the spawner. Call before importing grpc, with no other threads running. `close`: the
    daemon's descriptors the spawner must not keep (its instance locks)."""
    if "grpc" in sys.modules or threading.active_count() > 1:
        raise RuntimeError("the spawner must be started before gRPC is imported and before any thread")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            for fd in close or []:
                os.close(fd)
            ours.close()
            _die_with_parent(parent)
            # A limit that lets the daemon's inline loop lower its nice value (LimitNICE in the unit)
            # must not pass on to sessions: nothing the spawner starts may raise its own priority.
            resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _serve(theirs, config)
        except BaseException as exc:  # report, never fall back into the daemon's code
            print(f"adl-enforcerd spawner: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return SpawnerHandle(pid, ours, threading.Lock())


def _serve(sock: socket.socket, config: SpawnerConfig) -> None:
    load_what_supervisors_run()
    # What a spawner killed before its cleanup left empty (its prepared supervisors' cgroup...): one
    # daemon at a time holds the cgroup group, so nothing empty there is another's.
    remove_helper_groups(config.cgroup_group)
    sessions = _Sessions(_sessions_guardian(config))
    try:
        _serve_orders(sock, config, sessions)
    finally:
        _end_waiting(sessions)
        from ..sandbox import cgroups

        with contextlib.suppress(OSError):  # what is still dying there goes with the rest
            prepared = cgroups.existing(group=config.cgroup_group + HELPERS_SUFFIX).get(_prepared_name())
            if prepared is not None:
                prepared.remove(timeout=2)
        remove_helper_groups(config.cgroup_group)


def load_what_supervisors_run() -> None:
    """Import and build, once, what every supervisor and the processes it forks would otherwise
    load after their fork (each page of it then copied into every session): the launch path, the
    message it reports SessionEnded in, the caches its first uses build, and the seccomp programs
    (its stage is forked on the launch path and would build its own). The policy compiler, its
    schemas' validators and the region map's parser are loaded by the first order's compilation
    ahead."""
    import encodings.ascii  # noqa: F401 - the stage reads /proc/self/status as ASCII

    from .. import launching  # noqa: F401
    from ..policy import grants  # noqa: F401 - the kernel-audit reader explains a session's denials
    from ..sandbox import as_caller, seccomp  # noqa: F401 - as_caller: the caller's cwd looked up
    from ..v1 import enforcer_pb2  # noqa: F401 - protobuf only: no gRPC, no thread

    _first_uses()
    for plan in seccomp.variants():
        seccomp.compile_filter(plan)


def _sessions_guardian(config: SpawnerConfig) -> Any:
    """One guardian for every daemon session (guardian.py): if this process dies, even by SIGKILL,
    its supervisors die with it and the guardian kills and removes every session's cgroup. While
    it lives, this process removes each session's cgroup when its supervisor ends (_Sessions)."""
    from ..sandbox import cgroups, stage

    pid, sock = stage._fork(stage._exec_guardian)
    watcher = stage.Guardian(pid, sock)
    watcher.watch_sessions(cgroups.group_directories(group=config.cgroup_group))
    watcher.confirm()
    return watcher


@dataclass
class _Sessions:
    """The supervisors this process forked, and what it removes when each ends."""

    guardian: Any  # stage.Guardian: its socket is this process's alone (each supervisor closes its copy)
    children: dict[int, str] = field(default_factory=dict)  # supervisor pid -> session
    pidfds: dict[int, int] = field(default_factory=dict)  # supervisor pid -> pidfd: readable once it ends
    helpers: dict[int, Any] = field(default_factory=dict)  # supervisor pid -> its helpers' cgroup
    groups: dict[int, Any] = field(default_factory=dict)  # supervisor pid -> its session's cgroup
    left: list[Any] = field(default_factory=list)  # sessions' cgroups still to remove
    reported: set[str] = field(default_factory=set)  # cgroups whose removal failed, said once each
    waiting: list[_Waiting] = field(default_factory=list)  # prepared supervisors, oldest first
    retired: set[int] = field(default_factory=set)  # prepared supervisors told to end, not reaped yet
    prepare_at: float = 0.0  # monotonic time before which no supervisor is prepared
    failures: int = 0  # setbacks of _prepare_later in a row (a hand-over resets it): the pause grows with it

    def links(self) -> list[socket.socket]:
        """The prepared supervisors' sockets: only this process may hold them."""
        return [waiting.link for waiting in self.waiting]

    def remove_left(self) -> None:
        """Kill and remove what ended supervisors left, without waiting: a cgroup whose members
        are still dying is tried again at the next turn."""
        self.left = [group for group in self.left if not _removed(group, self.reported)]
        self.reported &= {str(group.directories[0]) for group in self.left}


@dataclass
class _Waiting:
    """A supervisor forked before its order (see the module's docstring)."""

    pid: int
    link: socket.socket  # this process's end: the order goes here, once; closing it retires the supervisor


def _removed(group: Any, reported: set[str]) -> bool:
    """Whether the session's cgroup is gone; kills its members, removes it once they are gone. An
    error other than EBUSY is logged once per cgroup (it is retried every turn)."""
    try:
        if not any(d.exists() for d in group.directories):
            return True
        if group.members():
            group.kill_all()
            return False
        for directory in reversed(group.directories):
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()
        return True
    except OSError as exc:  # EBUSY while the last members are reaped: tried again at the next turn
        name = str(group.directories[0])
        if exc.errno != errno.EBUSY and name not in reported:
            reported.add(name)
            print(f"adl-enforcerd spawner: removing {name}: {exc} (retried until it goes)", file=sys.stderr)
        return False


def _first_uses() -> None:
    """What a supervisor's audit writer does in a process, done once here on a throwaway log: the
    first use of each step builds caches (the log files' glob pattern compiled, the record text
    caches, OpenSSL's Ed25519 set-up) and specializes the bytecode it runs. Done in a forked
    supervisor, every page that holds them would be copied into it; done here, the supervisors
    share them. The throwaway key and log are this process's own, in a directory only root can
    enter, removed at once: the spawner never holds the audit key, and what stays cached is a
    function of constants (patterns, timestamps, names), never of a session."""
    import tempfile
    from pathlib import Path

    from ..audit.keys import AuditKeyError, load_or_create

    try:
        with tempfile.TemporaryDirectory(prefix="adl-enforcerd-spawner-") as tmp:
            key = Path(tmp) / "key.pem"
            load_or_create(key)  # created; each writer below loads it as a supervisor's does
            for _ in range(2):  # a new log, then one with records to continue
                writer = AuditWriter(Path(tmp) / "log", key, source="adl-enforcerd")
                try:
                    receipt = writer.append(records.LAUNCH, {"first_use": True}, corr="first-use")
                    writer.sync(receipt.seq)
                    writer.append_many([Entry(records.EXIT, {"first_use": True}, "first-use")], sync=True)
                finally:
                    writer.close()
    except (OSError, AuditUnavailable, AuditKeyError) as exc:  # a full /tmp: only memory is at stake
        print(f"adl-enforcerd spawner: the audit writer's first use failed ({exc}); sessions make it", file=sys.stderr)
    if threading.active_count() > 1:  # the writer's flusher must be gone: this process forks
        raise RuntimeError("a thread outlived the audit writer's first use in the spawner")


def remove_helper_groups(cgroup_group: str, keep: str | None = None) -> None:
    """The helpers' group directories of `cgroup_group`, once empty (a supervisor still running
    keeps its own), but `keep`."""
    from ..sandbox import cgroups

    with contextlib.suppress(OSError):
        for base in cgroups.group_directories(group=cgroup_group + HELPERS_SUFFIX):
            if base.is_dir():
                for directory in base.iterdir():
                    if directory.name != keep:
                        with contextlib.suppress(OSError):
                            directory.rmdir()
                with contextlib.suppress(OSError):
                    base.rmdir()


def _serve_orders(sock: socket.socket, config: SpawnerConfig, sessions: _Sessions) -> None:
    while True:
        timeout = 0.02 if sessions.left else 0.2
        if len(sessions.waiting) < config.prepared_sessions:
            timeout = min(timeout, max(0.0, sessions.prepare_at - time.monotonic()))
        ordered = _wait(sock, sessions.pidfds.values(), timeout)
        _reap(sessions, sock, config)
        sessions.remove_left()
        if not ordered:
            _prepare_one(sessions, sock, config)
            continue
        try:
            frame = recv_frame(sock, max_fds=4)
        except (OSError, FrameError):
            return
        if frame is None:  # the daemon went away
            return
        data, fds = frame
        try:
            order = read_order(data)
            if isinstance(order, LaunchOrder) and len(fds) != 4:
                raise OrderError(f"a launch order comes with 4 descriptors, not {len(fds)}")
        except OrderError as exc:
            _refuse_order(sock, data, fds, exc)
            continue
        if isinstance(order, TerminateOrder):
            _terminate(sessions, order, fds)
        else:
            _launch(sock, config, sessions, order, data, fds)


def _terminate(sessions: _Sessions, order: TerminateOrder, fds: list[int]) -> None:
    """Tell the supervisor of the order's session to end it (SIGUSR1)."""
    for fd in fds:
        os.close(fd)
    for pid, session in sessions.children.items():  # a child not reaped yet: its pid is still its own
        if session == order.session:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGUSR1)


def _launch(
    sock: socket.socket, config: SpawnerConfig, sessions: _Sessions, order: LaunchOrder, data: bytes, fds: list[int]
) -> None:
    """Make the order's cgroups and hand it to a prepared supervisor, or fork one for it."""
    if _compile_ahead(order, config) and sessions.waiting:
        _retire_waiting(sessions)  # forked before these documents were compiled here
        # Paced as failures are: orders that each compile (a caller cycling through more agents
        # than a process remembers compiled) must not make every refill a waste.
        _prepare_later(sessions, "supervisors prepared before these documents were compiled were retired")
    sessions.prepare_at = max(sessions.prepare_at, time.monotonic() + REFILL_PAUSE_S)
    try:
        helper_group = _helpers_cgroup(order.session, config)
        joins = helper_group.join_files()
    except OSError as exc:
        helper_group = None
        joins = [f"/nonexistent/{exc}"]  # the supervisor refuses the session: nothing runs unaccounted
    session_group = _session_cgroup(order.session, config)
    pid = _hand_over(sessions, order, fds, joins, session_group)
    if pid is None:
        try:
            pid = _fork_supervisor(sock, config, sessions, order, fds, joins, session_group)
        except OSError as exc:  # EAGAIN under a full pids limit: this session only, never every one
            for made in (helper_group, session_group[0]):
                if made is not None:
                    with contextlib.suppress(OSError):
                        made.remove(timeout=1)
            _refuse_order(sock, data, fds, OrderError(f"no supervisor could be started: {exc}"))
            return
    _started(sessions, sock, order, fds, pid, helper_group, session_group)


def _fork_supervisor(
    sock: socket.socket,
    config: SpawnerConfig,
    sessions: _Sessions,
    order: LaunchOrder,
    fds: list[int],
    joins: list[str],
    session_group: tuple[Any, str | None],
) -> int:
    """Fork a supervisor for the order (no prepared one took it): its pid; OSError if fork fails."""
    # Blocked until the supervisor has its handler: an early SIGUSR1 must not kill it outright.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        raise
    if pid == 0:  # never returns: whatever fails, the child exits, never serving as the spawner
        code = 1
        try:
            _in_child(sock, sessions)
            code = _supervise(order, fds, config, joins, session_group)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    try:
        sessions.pidfds[pid] = os.pidfd_open(pid)
    except OSError as exc:  # out of descriptors: its end is then found by the loop's next turn
        print(f"adl-enforcerd spawner: no pidfd for supervisor {pid}: {exc}", file=sys.stderr)
    return pid


def _in_child(sock: socket.socket, sessions: _Sessions) -> None:
    """In a supervisor just forked: let go of what only the spawner may hold."""
    sock.close()
    # Only the spawner may hold it: the guardian acts once every holder is gone.
    sessions.guardian.release()
    for pidfd in sessions.pidfds.values():
        os.close(pidfd)
    for link in sessions.links():  # another prepared supervisor's order must never come from here
        link.close()
    _die_with_parent(os.getppid())


def _started(
    sessions: _Sessions,
    sock: socket.socket,
    order: LaunchOrder,
    fds: list[int],
    pid: int,
    helper_group: Any,
    session_group: tuple[Any, str | None],
) -> None:
    """A supervisor has the order: what it leaves behind is this process's to remove when it ends."""
    for fd in fds:
        os.close(fd)
    sessions.children[pid] = order.session
    if helper_group is not None:
        sessions.helpers[pid] = helper_group
    if session_group[0] is not None:
        sessions.groups[pid] = session_group[0]
    send_frame(sock, SessionStarted(order.session, pid).to_json())


def _prepare_one(sessions: _Sessions, sock: socket.socket, config: SpawnerConfig) -> None:
    """Fork one more prepared supervisor when fewer wait than configured and orders have paused."""
    if len(sessions.waiting) >= config.prepared_sessions or time.monotonic() < sessions.prepare_at:
        return
    try:
        joins = _prepared_cgroup(config).join_files()
    except OSError as exc:  # nothing is forked that no bound holds
        _prepare_later(sessions, f"no supervisor could be prepared: its cgroup: {exc}")
        return
    try:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    except OSError as exc:  # out of descriptors (or memory): the spawner's end would be every session's
        _prepare_later(sessions, f"no supervisor could be prepared: {exc}")
        return
    # Blocked until it has its order and the handler that goes with it, as in a supervisor forked
    # at its order (a SIGUSR1 is only ever sent to a supervisor that has its order).
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        pid = os.fork()
    except OSError as exc:  # EAGAIN under a full pids limit: each order forks its own meanwhile
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        ours.close()
        theirs.close()
        _prepare_later(sessions, f"no supervisor could be prepared: {exc}")
        return
    if pid == 0:  # never returns, as in _fork_supervisor
        code = 1
        try:
            ours.close()
            _in_child(sock, sessions)
            code = _await_order(theirs, config, joins)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    theirs.close()
    ours.settimeout(HAND_OVER_S)
    try:
        sessions.pidfds[pid] = os.pidfd_open(pid)
    except OSError as exc:  # out of descriptors: not kept, as it could not be watched
        ours.close()  # it ends at once: end of stream before any order
        sessions.retired.add(pid)
        _prepare_later(sessions, f"a prepared supervisor could not be watched (no pidfd: {exc})")
        return
    sessions.waiting.append(_Waiting(pid, ours))


def _prepare_later(sessions: _Sessions, why: str) -> None:
    """A prepared supervisor failed, or those waiting were retired: the next is forked after a pause
    that doubles each time in a row (a hand-over resets it)."""
    sessions.failures += 1
    pause = min(PREPARE_RETRY_S[0] * 2 ** (sessions.failures - 1), PREPARE_RETRY_S[1])
    sessions.prepare_at = max(sessions.prepare_at, time.monotonic() + pause)
    print(f"adl-enforcerd spawner: {why}; the next is prepared in {pause:g} s", file=sys.stderr)


def _retire_waiting(sessions: _Sessions) -> None:
    """End every prepared supervisor still waiting: each sees its socket's end and exits."""
    for waiting in sessions.waiting:
        waiting.link.close()
        sessions.retired.add(waiting.pid)
    sessions.waiting.clear()


def _hand_over(
    sessions: _Sessions, order: LaunchOrder, fds: list[int], joins: list[str], session_group: tuple[Any, str | None]
) -> int | None:
    """Hand the order to the oldest prepared supervisor; its pid, or None if none took it (the
    order then forks a supervisor of its own). A supervisor that did not take it whole is killed."""
    while sessions.waiting:
        waiting = sessions.waiting.pop(0)
        try:
            send_frame(waiting.link, pickle.dumps((order.to_json(), joins, session_group)), fds)
            sessions.failures = 0
            return waiting.pid
        except (OSError, FrameError) as exc:
            print(f"adl-enforcerd spawner: a prepared supervisor did not take its order: {exc}", file=sys.stderr)
            pidfd = sessions.pidfds.get(waiting.pid)
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            sessions.retired.add(waiting.pid)
        finally:
            waiting.link.close()  # one order per prepared supervisor, whatever happened
    return None


def _end_waiting(sessions: _Sessions) -> None:
    """The spawner stops: the prepared supervisors end (the stage's init with each, by its parent
    death signal, and the future agent with init's PID namespace), and are collected."""
    ending = [w.pid for w in sessions.waiting] + sorted(sessions.retired)
    _retire_waiting(sessions)
    for pid in ending:
        pidfd = sessions.pidfds.get(pid)
        if pidfd is not None:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


def _wait(sock: socket.socket, pidfds: Iterable[int], timeout_s: float) -> bool:
    """Wait for an order or a supervisor's end (its pidfd turns readable: its session's cgroup
    then goes at once), at most `timeout_s`; whether the daemon's socket has something (or is
    closed). poll(), not select(): one pidfd per running session may be numbered above 1023."""
    poller = select.poll()
    poller.register(sock.fileno(), select.POLLIN)
    for pidfd in pidfds:
        poller.register(pidfd, select.POLLIN)
    return any(fd == sock.fileno() for fd, _events in poller.poll(int(timeout_s * 1000)))


def _session_cgroup(session: str, config: SpawnerConfig) -> tuple[Any, str | None]:
    """The session's cgroup, made here so that this process, which outlives the supervisor, knows
    it and removes it when the supervisor ends; or why there is none (the supervisor refuses the
    session with it)."""
    from ..sandbox import cgroups

    try:
        group = cgroups.create(session, group=config.cgroup_group)
    except OSError as exc:
        return None, str(exc)
    try:
        cgroups.bound_siblings(group, int(cgroups.host_tasks() * AGENTS_TASKS_SHARE))
    except OSError as exc:  # never a session that all sessions' bound does not hold
        with contextlib.suppress(OSError):
            group.remove(timeout=1)
        return None, f"the sessions' tasks cannot be bounded together: {exc}"
    return group, None


def _compile_ahead(order: LaunchOrder, config: SpawnerConfig) -> bool:
    """Compile the order's documents here, unless already compiled (launching.PolicyDocuments
    remembers them), so that the supervisor forked next finds them compiled: one compilation per
    set of documents and settings instead of one per session. What fails here is left to the
    supervisor, which compiles the documents itself and refuses the session with the reason.
    Whether something was compiled (supervisors forked before it would compile it again): a policy
    PolicyDocuments.load remembered is the very object it returned before, a new one is not."""
    from ..policy.errors import Refusal

    try:
        compiled = policy_documents(order, config).load()
    except (Refusal, OSError):
        return False
    except Exception as exc:  # never the spawner's end: the supervisor meets it too and refuses
        print(f"adl-enforcerd spawner: compiling ahead failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return False
    if _LOADED.get(id(compiled)) is compiled:
        return False
    _LOADED[id(compiled)] = compiled
    return True


# What PolicyDocuments.load returned in this process, by id: an entry goes when its policy does (once
# launching forgets it), so an id is never found again for another object.
_LOADED: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def policy_documents(order: LaunchOrder, config: SpawnerConfig) -> PolicyDocuments:
    """The documents of an order, as the launch path compiles them with the daemon's settings."""
    from ..launching import PolicyDocuments

    return PolicyDocuments(
        adl=dict(order.adl),
        aaif=dict(order.aaif) if order.aaif is not None else None,
        regions=config.regions,
        baseline=config.baseline,
        production=config.production,
        home_region=config.egress.home_region,
        spec_dir=config.spec_dir,
    )


def _refuse_order(sock: socket.socket, data: bytes, fds: list[int], error: OrderError) -> None:
    """An order that is not what the daemon sends: nothing is launched. The caller hears of it on
    its launch connection (when attached), and the daemon that the session, if named, has ended."""
    print(f"adl-enforcerd spawner: order refused: {error}", file=sys.stderr)
    session = session_named(data)
    if len(fds) == 4:
        from ..v1 import enforcer_pb2 as pb

        ended = pb.SessionEnded(
            session=session or "", reason="refused", exit_code=125, detail=f"launch order refused: {error}"
        )
        with contextlib.suppress(OSError, FrameError):
            client = socket.socket(fileno=os.dup(fds[3]))
            with client:
                client.settimeout(5.0)
                send_frame(client, ended.SerializeToString())
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    if session is not None:
        send_frame(sock, SessionGone(session, 125).to_json())


def _prepared_name() -> str:
    """The prepared supervisors' cgroup, in the helpers' directory: named by this spawner, so that
    one a spawner killed left behind is never taken for this one's."""
    return f"prepared-{os.getpid()}"


def _prepared_cgroup(config: SpawnerConfig) -> Any:
    """The cgroup every prepared supervisor joins before it forks its stage, made when missing: in
    the helpers' directory, so under the bound on all root helpers' tasks (HELPERS_TASKS_SHARE), and
    bounded itself to PREPARED_PIDS tasks per prepared supervisor. Each moves out at its order (the
    supervisor into its helpers' cgroup, init and the future agent into the session's). No memory
    limit: pages touched here stay charged here once their process moves on, so a limit would count
    running sessions' memory against the next preparations."""
    from ..sandbox import cgroups

    helpers = config.cgroup_group + HELPERS_SUFFIX
    group = cgroups.existing(group=helpers).get(_prepared_name())
    if group is None:
        group = cgroups.create(_prepared_name(), group=helpers)
    group.apply(cgroups.Limits(pids_max=PREPARED_PIDS * max(1, config.prepared_sessions)))
    cgroups.bound_siblings(group, int(cgroups.host_tasks() * HELPERS_TASKS_SHARE))
    return group


def _helpers_cgroup(session: str, config: SpawnerConfig) -> Any:
    """The cgroup of a session's root helpers (its supervisor, and the egress filter it starts):
    their memory and processes are counted and bounded as the agent's are, in a group of their own
    beside the sessions' so that nothing takes them for sessions."""
    from ..sandbox import cgroups

    group = cgroups.create(session, group=config.cgroup_group + HELPERS_SUFFIX)
    try:
        # The egress filter's pool: up to two threads per open connection (WebSocket relays, lookups).
        pids = HELPER_PIDS + 2 * config.egress.max_connections
        group.apply(cgroups.Limits(memory_bytes=config.helper_memory_mb << 20, pids_max=pids))
        cgroups.bound_siblings(group, int(cgroups.host_tasks() * HELPERS_TASKS_SHARE))
    except OSError:
        group.remove(timeout=1)
        raise
    return group


def _reap(sessions: _Sessions, sock: socket.socket, config: SpawnerConfig) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid == sessions.guardian.pid:  # it must not be missing for a moment longer than this
            print("adl-enforcerd spawner: the sessions' guardian ended; starting another", file=sys.stderr)
            sessions.guardian.release()
            sessions.guardian = _sessions_guardian(config)
            continue
        pidfd = sessions.pidfds.pop(pid, None)
        if pidfd is not None:
            os.close(pidfd)
        if pid in sessions.retired:
            sessions.retired.discard(pid)
            continue
        ended = [waiting for waiting in sessions.waiting if waiting.pid == pid]
        if ended:  # a prepared supervisor ended before its order (its stage died, or it was killed)
            sessions.waiting.remove(ended[0])
            ended[0].link.close()
            _prepare_later(sessions, f"a prepared supervisor ended before its order ({status:#x})")
            continue
        session_group = sessions.groups.pop(pid, None)
        if session_group is not None:  # gone already unless the supervisor died before removing it
            sessions.left.append(session_group)
            sessions.remove_left()
        group = sessions.helpers.pop(pid, None)
        if group is not None:
            with contextlib.suppress(OSError):
                group.remove(timeout=2)  # an egress filter left behind goes with it
            if not sessions.helpers:  # the last one: no empty directory is left when the daemon stops
                # The prepared supervisors' group stays: one forked a moment ago may not have joined it yet.
                remove_helper_groups(config.cgroup_group, keep=_prepared_name())
        session = sessions.children.pop(pid, None)
        if session is not None:
            event = SessionGone(session, os.waitstatus_to_exitcode(status))
            send_frame(sock, event.to_json())


def daemon_masks(config: SpawnerConfig) -> Masks:
    """The daemon's audit log and signing key, hidden from every session whatever its grants say: an
    agent that could read the key could forge records, and the log holds every caller's decisions."""
    from ..launching import Masks

    detail = f"the daemon's audit log {config.audit_dir} and signing key {config.audit_key} are masked"
    return Masks((config.audit_dir,), (config.audit_key,), "daemon_files", detail)


def _await_order(link: socket.socket, config: SpawnerConfig, joins: list[str]) -> int:
    """A prepared supervisor: join the prepared supervisors' cgroup (`joins`, its cgroup.procs
    files), fork the stage (its init and future agent, in that cgroup too), wait for one order on
    `link`, then supervise that session. It ends without one when the spawner closes `link`, when
    it cannot join, or when its stage failed or is gone (the spawner then prepares another); an
    order the spawner managed to send is taken all the same, never lost unrecorded."""
    from ..sandbox.stage import StageError, prepare

    try:
        for path in joins:
            with open(path, "w") as f:
                f.write("0")
    except OSError as exc:  # nothing is forked outside the bound
        print(f"adl-enforcerd spawner: a prepared supervisor cannot join its cgroup: {exc}", file=sys.stderr)
        return 1

    # SIGUSR1 stays blocked here until the order's handler is set (see _prepare_one), but not in
    # the stage: the agent would inherit the mask (a supervisor forked at its order has unblocked
    # it before it forks the stage).
    mask = frozenset(signal.pthread_sigmask(signal.SIG_BLOCK, set()) - {signal.SIGUSR1})
    ahead: Prepared | None = None
    failed = True
    try:
        ahead = prepare(
            "prepared",
            cgroup_group=config.cgroup_group,
            made_by_parent=(None, None),
            join_later=True,
            signal_mask=mask,
        )
        ahead.stage.wait_announced()
        poller = select.poll()
        poller.register(link.fileno(), select.POLLIN)
        poller.register(ahead.stage.fileno(), select.POLLIN)  # readable before the order: the stage is gone
        failed = link.fileno() not in {fd for fd, _events in poller.poll()}
    except (StageError, OSError) as exc:
        print(f"adl-enforcerd spawner: a prepared supervisor's stage failed: {exc}", file=sys.stderr)
    if failed:
        # From now on a hand-over fails (EPIPE) and the spawner forks a supervisor of its own for
        # that order. One sent before is taken: its launch meets the stage's end, and refuses and
        # records the session (a stage that could not be forked at all is forked again for it).
        with contextlib.suppress(OSError):
            link.shutdown(socket.SHUT_RD)
    handed = False
    try:
        frame = recv_frame(link, max_fds=4)
        if frame is None:  # retired, or the stage failed before any order
            return 1 if failed else 0
        data, fds = frame
        link.close()
        if len(fds) != 4:
            for fd in fds:
                os.close(fd)
            return 1
        # A stage gone meanwhile is met by the launch, which then refuses and records the session.
        order_json, helper_joins, session_group = pickle.loads(data)
        order = read_order(order_json)
        if not isinstance(order, LaunchOrder):
            raise OrderError("a prepared supervisor takes a launch order only")
        handed = True
        stage = None if ahead is None else ahead.stage
        return _supervise(order, fds, config, helper_joins, session_group, ahead=stage)
    except (StageError, OSError, FrameError, OrderError) as exc:
        print(f"adl-enforcerd spawner: a prepared supervisor ended: {exc}", file=sys.stderr)
        return 1
    finally:
        if not handed and ahead is not None:
            ahead.discard()


def _supervise(
    order: LaunchOrder,
    fds: list[int],
    config: SpawnerConfig,
    helper_joins: list[str],
    session_group: tuple[Any, str | None],
    ahead: Stage | None = None,
) -> int:
    """One session, in its own process: compile, plan, audit, run, report to the caller.
    `session_group`: its cgroup as the spawner made it (or why there is none). `ahead`: the stage
    of a prepared supervisor, which joins the session's cgroup now."""
    from ..sandbox.stage import ParentWatches, Prepared, prepare

    session = order.session
    stdin, stdout, stderr, client_fd = fds
    for target, fd in enumerate((stdin, stdout, stderr)):
        if fd != target:  # one received as its own number is already in place
            os.dup2(fd, target)
            os.close(fd)
    client = socket.socket(fileno=client_fd)
    terminated = threading.Event()
    made: list[_Made] = []

    def terminate(_signum: int, _frame: Any) -> None:
        # TerminateSession: end the session at whatever step it is. Set first: a signal that lands
        # before the stage exists is seen by the launch path's checks.
        terminated.set()
        if made:
            made[0].kill()

    signal.signal(signal.SIGUSR1, terminate)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    # The session's cgroup and stage first: the stage's cgroup join (an RCU grace period on v1)
    # then overlaps opening the audit log below. Only then does this process move into its helpers'
    # cgroup: the session's is made below this process's own.
    if ahead is not None:
        group, error = session_group
        prepared = Prepared(session, ahead, ParentWatches(), group, error)
        if group is not None:  # without one the launch is refused before any order reaches the stage
            ahead.join(group.join_files())
    else:
        try:
            prepared = prepare(session, cgroup_group=config.cgroup_group, made_by_parent=session_group)
        except OSError as exc:  # EAGAIN under a full pids limit: this session is refused, never lost unrecorded
            return _refuse_unstarted(order, config, client, f"the session's stage could not be started: {exc}")
    made.append(_Made(prepared))
    try:
        # The move (an RCU grace period on v1) overlaps opening the audit log, planning and the launch
        # record: the launch waits for it only before it forks again or starts the agent.
        try:
            joining = _Join(helper_joins)
        except RuntimeError as exc:  # out of tasks: this session only
            return _refuse_unstarted(order, config, client, f"no thread could be started for the session: {exc}")
        return _supervise_prepared(order, config, client, made[0], terminated, joining)
    finally:
        made[0].close()
        prepared.discard()


class _Made:
    """The session's stage and cgroup, to end at whatever step the session is. The stage is named by
    a descriptor taken while it is surely not reaped: a signal sent through it later can only reach
    that process, never one that took its pid. It is killed itself because until it has joined the
    session's cgroup (while the policy is compiled) kill_all misses it and the agent it would start.
    A kernel without pidfds (before 5.3, so without Landlock either) leaves only the cgroup kill."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        try:
            self.stage_fd = os.pidfd_open(prepared.stage.pid)
        except OSError:
            self.stage_fd = -1

    def kill(self) -> None:
        if self.stage_fd >= 0:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(self.stage_fd, signal.SIGKILL)
        if self.prepared.group is not None:
            with contextlib.suppress(OSError):
                self.prepared.group.kill_all()

    def close(self) -> None:
        if self.stage_fd >= 0:
            os.close(self.stage_fd)
            self.stage_fd = -1


class _Join:
    """This process into its helpers' cgroup, on a thread of its own; wait() raises what failed. A
    bare thread: threading.Thread.start() waits until the new thread has been scheduled, which the
    launch would wait for on a busy machine."""

    def __init__(self, join_files: list[str]) -> None:
        self.join_files = join_files
        self.error: OSError | None = None
        self._done = threading.Event()
        _thread.start_new_thread(self._run, ())

    def _run(self) -> None:
        try:
            for path in self.join_files:
                with open(path, "w") as f:
                    f.write("0")
        except OSError as exc:
            self.error = exc
        finally:
            self._done.set()

    def wait(self) -> None:
        self._done.wait()
        if self.error is not None:
            raise OSError(f"the session's helpers cannot join their cgroup, nothing runs unaccounted: {self.error}")


def _supervise_prepared(
    order: LaunchOrder,
    config: SpawnerConfig,
    client: socket.socket,
    made: _Made,
    terminated: threading.Event,
    joining: _Join,
) -> int:
    from .. import launching
    from ..sandbox.identity import Identity

    prepared = made.prepared

    def stop_when_caller_leaves() -> None:
        # adl-exec going away (Ctrl-C, SIGKILL) ends its session at whatever step it is, as in
        # embedded mode.
        with contextlib.suppress(OSError):
            while client.recv(4096):
                pass
        made.kill()

    # The session's writer, once open: what it wrote or withheld decides the exit status.
    opened: list[SessionWriter] = []

    def open_audit() -> AuditWriter:
        settings = WriterSettings(group_ms=config.audit_group_ms, group_records=config.audit_group_records)
        writer = SessionWriter(
            config.audit_dir,
            config.audit_key,
            source="adl-enforcerd",
            settings=settings,
            order=order,
            terminated=terminated.is_set,
        )
        opened.append(writer)
        return writer

    try:
        _thread.start_new_thread(stop_when_caller_leaves, ())  # not waited for, as _Join's
    except RuntimeError as exc:  # out of tasks: this session only
        return _refuse_unstarted(order, config, client, f"no thread could be started for the session: {exc}")
    request = launching.LaunchRequest(
        session=order.session,
        argv=order.argv,
        environ=order.environ,
        policy=policy_documents(order, config),
        policy_digest=order.policy_digest,
        user=Identity(order.uid, order.gid, "caller"),
        cwd=order.cwd,
        caller_uid=order.uid,
        accept_unenforced=frozenset(order.accept_unenforced),
        pids_max=order.pids_max,
        egress=config.egress,
        masks=daemon_masks(config),
        cgroup_group=config.cgroup_group,
        presets=config.presets,
        kernel_audit=config.kernel_audit,
    )

    def report(result: launching.Result) -> None:
        with contextlib.suppress(OSError):
            send_frame(client, session_ended(order.session, result).SerializeToString())

    # SessionEnded goes out before the audit writer's close (the daemon, stopping, still waits for
    # this process to end, close included).
    result = launching.launch(
        request, open_audit, prepared=prepared, terminated=terminated.is_set, before_fork=joining.wait, report=report
    )
    if opened and opened[0].withheld:  # not in the log: the daemon must count it
        return REFUSAL_COUNTED
    if isinstance(result, launching.Refused):
        return REFUSAL_RECORDED if opened and opened[0].refused else 1
    return 0


class SessionWriter(AuditWriter):
    """A supervisor's audit writer. It withholds the session's refusal when that would be the
    session's first record and the order says its caller's refusals are counted only: a caller must
    not flood the log every session shares with refusals only a supervisor finds (a cwd it may not
    use...). Once the session has a launch record, its end is always recorded, and so is a
    TerminateSession (the operator's doing, not a refusal of the caller's)."""

    def __init__(self, *args: Any, order: LaunchOrder, terminated: Callable[[], bool], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order, self.terminated = order, terminated
        self.wrote = False  # a record of the session
        self.refused = False  # its refusal, written
        self.withheld = False  # its refusal, withheld: the daemon counts it

    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        refusal = [e for e in entries if e.kind == records.REFUSED and e.corr == self.order.session]
        if refusal and not self.wrote and not self.order.refusal_detailed and not self.terminated():
            self.withheld = True
            # Unavailable to the launch path: it refuses the session all the same and tells the caller.
            raise AuditUnavailable("counted only: the caller's launch refusals are beyond their budget")
        receipts = super().append_many(entries, sync=sync)
        self.wrote = self.wrote or any(e.corr == self.order.session for e in entries)
        self.refused = self.refused or bool(refusal)
        return receipts


def _refuse_unstarted(order: LaunchOrder, config: SpawnerConfig, client: socket.socket, detail: str) -> int:
    """A session whose supervisor could not start what it needs (no task left: the unit's or a pids
    cgroup's limit): recorded as refused (or only counted, as the order says) and its caller told so."""
    from ..audit.events import caller_fields
    from ..session import record_refusal
    from ..v1 import enforcer_pb2 as pb

    status = REFUSAL_COUNTED
    if order.refusal_detailed:
        status = 1  # unless it is recorded
        with contextlib.suppress(AuditUnavailable, OSError):
            writer = AuditWriter(config.audit_dir, config.audit_key, source="adl-enforcerd", settings=WriterSettings())
            try:
                argv = list(order.argv)
                record_refusal(writer, None, order.session, detail, argv, caller_fields(order.uid, order.cwd))
                status = REFUSAL_RECORDED
            finally:
                writer.close()
    ended = pb.SessionEnded(session=order.session, reason="refused", exit_code=125, detail=detail)
    with contextlib.suppress(OSError, FrameError):
        send_frame(client, ended.SerializeToString())
    return status


def session_ended(session: str, result: Result) -> Any:
    """The SessionEnded message that tells the caller how its session ended."""
    from ..launching import Ended, Refused, Terminated
    from ..v1 import enforcer_pb2 as pb

    if isinstance(result, Refused):
        return pb.SessionEnded(session=session, reason="refused", exit_code=125, detail=result.reason)
    if isinstance(result, Terminated):
        return pb.SessionEnded(
            session=session,
            reason="terminated",
            exit_code=128 + signal.SIGKILL,
            signal=signal.SIGKILL,
            detail=result.step,
        )
    if not isinstance(result, Ended):  # an explanation: the daemon never asks for one
        raise TypeError(f"a supervisor does not report {type(result).__name__}")
    outcome = result.outcome
    return pb.SessionEnded(
        session=session,
        reason=outcome.reason,
        exit_code=outcome.exit_code,
        signal=outcome.signal or 0,
        duration_ms=int(outcome.duration_s * 1000),
        creations_refused=outcome.guard_refused_total,
        kernel_denials_json=json.dumps(result.kernel_denials),
    )
