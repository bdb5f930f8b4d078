"""The single-threaded spawner: forked by adl-enforcerd before any gRPC code is imported.

Forking from a process that runs gRPC threads crashes children, so every session is launched from
here. The daemon sends a launch order (JSON) with the caller's stdin, stdout, stderr and launch
connection attached; the spawner forks one supervisor per session, which compiles the policy again
from the very documents the daemon checked (and refuses if the digest differs), runs it with the
same launcher as embedded adl-exec, audits it with its own writer on the same log, and reports
SessionEnded straight to the caller. The spawner tells the daemon when each supervisor ends.

Both the spawner and each supervisor die with their parent (PR_SET_PDEATHSIG); a supervisor's
death releases the launcher's guardian, which kills the session's cgroup.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..framing import FrameError, recv_frame, send_frame

if TYPE_CHECKING:
    from ..sandbox.stage import Prepared

PR_SET_PDEATHSIG = 1
HELPERS_SUFFIX = ".helpers"  # cgroup directory of the sessions' helpers: <cgroup_group>.helpers
HELPER_PIDS = 128  # the supervisor's threads and children, and the egress filter's besides its connections
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(expected_parent: int) -> None:
    _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != expected_parent:  # the parent died before prctl took effect
        os._exit(1)


@dataclass
class SpawnerHandle:
    pid: int
    sock: socket.socket
    lock: threading.Lock

    def launch(self, order: dict[str, Any], fds: list[int], cancelled: Callable[[], bool] = lambda: False) -> bool:
        """Send the order, unless `cancelled()` says the session was terminated meanwhile (asked
        under the same lock as terminate(), so one of the two always sees the other)."""
        with self.lock:
            if cancelled():
                return False
            send_frame(self.sock, json.dumps(order).encode(), fds)
            return True

    def terminate(self, session: str, mark: Callable[[], None]) -> None:
        """Tell the session's supervisor to end it (SIGUSR1), after `mark()` under the launch lock."""
        with self.lock:
            mark()
            send_frame(self.sock, json.dumps({"terminate": session}).encode())

    def events(self) -> Any:
        """Yield the spawner's reports ({"event": "started"|"ended", ...}) until it goes away."""
        while True:
            try:
                frame = recv_frame(self.sock)
            except (OSError, FrameError):
                return
            if frame is None:
                return
            yield json.loads(frame[0])


class WithCaller:
    """An audit writer or sink that adds the caller's uid and the working directory to the launch and
    refusal records of a session; everything else passes through."""

    KINDS = frozenset({"launch", "refused"})  # audit.records.LAUNCH, REFUSED

    def __init__(self, sink: Any, uid: int, cwd: str) -> None:
        self._sink, self._extra = sink, {"caller_uid": uid, "cwd": cwd}

    def append(self, kind: str, payload: dict[str, Any], **kw: Any) -> Any:
        if kind in self.KINDS:
            payload = {**payload, **self._extra}
        return self._sink.append(kind, payload, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sink, name)


def start(config: dict[str, Any]) -> SpawnerHandle:
    """Fork the spawner. Call before importing grpc, with no other threads running."""
    if "grpc" in sys.modules or threading.active_count() > 1:
        raise RuntimeError("the spawner must be started before gRPC is imported and before any thread")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
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


def _serve(sock: socket.socket, config: dict[str, Any]) -> None:
    # Imported and compiled here, once, so each supervisor forks with the launcher loaded and the
    # seccomp programs built (its stage is forked on the launch path and would build its own).
    from .. import session as sessions  # noqa: F401
    from ..sandbox import seccomp

    for plan in seccomp.variants():
        seccomp.compile_filter(plan)

    children: dict[int, str] = {}
    helpers: dict[int, Any] = {}  # supervisor pid -> its helpers' cgroup
    try:
        _serve_orders(sock, config, children, helpers)
    finally:
        _remove_helper_groups(config)


def _remove_helper_groups(config: dict[str, Any]) -> None:
    """The helpers' group directories, once empty (a supervisor still running keeps its own)."""
    from ..sandbox import cgroups

    with contextlib.suppress(OSError):
        for base in cgroups.group_directories(group=config["cgroup_group"] + HELPERS_SUFFIX):
            if base.is_dir():
                for directory in base.iterdir():
                    with contextlib.suppress(OSError):
                        directory.rmdir()
                with contextlib.suppress(OSError):
                    base.rmdir()


def _serve_orders(
    sock: socket.socket, config: dict[str, Any], children: dict[int, str], helpers: dict[int, Any]
) -> None:
    while True:
        ready, _, _ = select.select([sock], [], [], 0.2)
        _reap(children, sock, helpers, config)
        if not ready:
            continue
        try:
            frame = recv_frame(sock, max_fds=4)
        except (OSError, FrameError):
            return
        if frame is None:  # the daemon went away
            return
        data, fds = frame
        order = json.loads(data)
        if "terminate" in order:
            for pid, session in children.items():  # a child not reaped yet: its pid is still its own
                if session == order["terminate"]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGUSR1)
            continue
        try:
            helper_group = _helpers_cgroup(order["session"], config)
            joins = helper_group.join_files()
        except OSError as exc:
            helper_group = None
            joins = [f"/nonexistent/{exc}"]  # the supervisor refuses the session: nothing runs unaccounted
        # Blocked until the supervisor has its handler: an early SIGUSR1 must not kill it outright.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
        pid = os.fork()
        if pid == 0:
            sock.close()
            _die_with_parent(os.getppid())
            code = 1
            try:
                code = _supervise(order, fds, config, joins)
            finally:
                os._exit(code)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
        for fd in fds:
            os.close(fd)
        children[pid] = order["session"]
        if helper_group is not None:
            helpers[pid] = helper_group
        send_frame(sock, json.dumps({"event": "started", "session": order["session"], "pid": pid}).encode())


def _helpers_cgroup(session: str, config: dict[str, Any]) -> Any:
    """The cgroup of a session's root helpers (its supervisor, and the egress filter it starts):
    their memory and processes are counted and bounded as the agent's are, in a group of their own
    beside the sessions' so that nothing takes them for sessions."""
    from ..sandbox import cgroups

    group = cgroups.create(session, group=config["cgroup_group"] + HELPERS_SUFFIX)
    try:
        # The egress filter runs two threads per open connection.
        pids = HELPER_PIDS + 2 * int(config["egress"].get("max_connections", 1024))
        group.apply(cgroups.Limits(memory_bytes=config["helper_memory_mb"] << 20, pids_max=pids))
    except OSError:
        group.remove(timeout=1)
        raise
    return group


def _reap(children: dict[int, str], sock: socket.socket, helpers: dict[int, Any], config: dict[str, Any]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        group = helpers.pop(pid, None)
        if group is not None:
            with contextlib.suppress(OSError):
                group.remove(timeout=2)  # an egress filter left behind goes with it
            if not helpers:  # the last one: no empty directory is left when the daemon stops
                _remove_helper_groups(config)
        session = children.pop(pid, None)
        if session is not None:
            event = {"event": "ended", "session": session, "status": os.waitstatus_to_exitcode(status)}
            send_frame(sock, json.dumps(event).encode())


def enter_as_caller(path: str, uid: int, gid: int) -> str:
    """Change to the working directory the caller asked for, found with the credentials the agent
    will have (uid, gid, no supplementary groups), never root's: a directory the caller could not
    reach itself (behind another user's 0700 home) is refused. The lookup runs in a child that drops
    to those credentials and hands the directory back as a descriptor; this process then enters
    that very directory, so nothing can swap the path in between. Returns its path."""
    if uid == os.getuid():
        os.chdir(path)
        return os.getcwd()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            # Nothing of root's to reach through /proc/self/fd/N or /proc/self/cwd: those magic
            # links would open what they point at without the path's permission checks.
            os.chdir("/")
            os.closerange(0, theirs.fileno())
            os.closerange(theirs.fileno() + 1, os.sysconf("SC_OPEN_MAX"))
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            try:
                fd = os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError as exc:
                theirs.sendall(f"{exc.strerror or exc}".encode()[:512])
            else:
                socket.send_fds(theirs, [b"ok"], [fd])
                code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        message, fds, _flags, _addr = socket.recv_fds(ours, 512, 1)
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if not fds:
        detail = message.decode(errors="replace") or "the lookup failed"
        raise PermissionError(f"working directory {path!r}: not reachable as uid {uid}: {detail}")
    try:
        os.fchdir(fds[0])
    finally:
        os.close(fds[0])
    return os.getcwd()


def mask_daemon_files(plan: Any, audit_dir: Path, audit_key: Path) -> None:
    """Hide the daemon's audit log and signing key from the session, whatever its grants say: an
    agent that could read the key could forge records, and the log holds every caller's decisions."""
    for directory in (audit_dir,):
        if directory.is_dir() and str(directory) not in plan.dir_masks:
            plan.dir_masks.append(str(directory))
    if audit_key.is_file() and str(audit_key) not in plan.file_masks:
        plan.file_masks.append(str(audit_key))
    plan.layers.append(_masks_layer(f"the daemon's audit log {audit_dir} and signing key {audit_key} are masked"))


def _masks_layer(detail: str) -> Any:
    from ..sandbox.plan import Layer

    return Layer("daemon_files", "mount namespace masks", "active", [detail])


def _supervise(order: dict[str, Any], fds: list[int], config: dict[str, Any], helper_joins: list[str]) -> int:
    """One session, in its own process: compile, plan, audit, run, report to the caller."""
    from ..sandbox.stage import prepare

    session = order["session"]
    stdin, stdout, stderr, client_fd = fds
    for target, fd in enumerate((stdin, stdout, stderr)):
        os.dup2(fd, target)
        os.close(fd)
    client = socket.socket(fileno=client_fd)
    terminated = threading.Event()
    made: list[Prepared] = []

    def terminate(_signum: int, _frame: Any) -> None:
        # TerminateSession: end the session at whatever step it is; the cgroup holds the stage or agent.
        terminated.set()
        group = made[0].group if made else None
        if group is not None:
            with contextlib.suppress(OSError):
                group.kill_all()

    signal.signal(signal.SIGUSR1, terminate)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    # The session's cgroup and stage first: the stage's cgroup join (an RCU grace period on v1)
    # then overlaps compiling the policy below. Only then does this process move into its helpers'
    # cgroup: the session's is made below this process's own.
    prepared = prepare(session, cgroup_group=config["cgroup_group"])
    made.append(prepared)
    # The move (an RCU grace period on v1) overlaps compiling the policy too.
    joining = _Join(helper_joins)
    try:
        return _supervise_prepared(order, config, session, client, prepared, terminated, joining)
    finally:
        prepared.discard()


class _Join(threading.Thread):
    """This process into its helpers' cgroup, on a thread of its own; wait() raises what failed."""

    def __init__(self, join_files: list[str]) -> None:
        super().__init__(daemon=True)
        self.join_files = join_files
        self.error: OSError | None = None
        self.start()

    def run(self) -> None:
        try:
            for path in self.join_files:
                with open(path, "w") as f:
                    f.write("0")
        except OSError as exc:
            self.error = exc

    def wait(self) -> None:
        super().join()
        if self.error is not None:
            raise OSError(f"the session's helpers cannot join their cgroup, nothing runs unaccounted: {self.error}")


def _supervise_prepared(
    order: dict[str, Any],
    config: dict[str, Any],
    session: str,
    client: socket.socket,
    prepared: Prepared,
    terminated: threading.Event,
    joining: _Join,
) -> int:
    from datetime import UTC, datetime

    from .. import session as sessions
    from ..audit import AuditUnavailable, AuditWriter, WriterSettings
    from ..documents import load_regions, schema_set
    from ..egress_settings import EgressSettings
    from ..policy import CompileOptions, compile_policy
    from ..policy.errors import Refusal
    from ..sandbox import runtime_presets
    from ..sandbox.launcher import LaunchError
    from ..sandbox.plan import PlanError, build_plan, load_baseline
    from ..v1 import enforcer_pb2 as pb

    def report(**fields: Any) -> None:
        with contextlib.suppress(OSError):
            send_frame(client, pb.SessionEnded(session=session, **fields).SerializeToString())

    try:
        writer = AuditWriter(
            config["audit_dir"],
            config["audit_key"],
            source="adl-enforcerd",
            settings=WriterSettings(group_ms=config["audit_group_ms"], group_records=config["audit_group_records"]),
        )
    except AuditUnavailable as exc:
        report(reason="refused", exit_code=125, detail=f"audit log unavailable, nothing runs unrecorded: {exc}")
        return 1
    uid, gid = order["uid"], order["gid"]
    recorder = WithCaller(writer, uid, order["cwd"])  # refusals name the caller and the cwd it asked for
    policy = None
    try:
        egress = EgressSettings(**config["egress"])
        options = CompileOptions(
            production=config["production"], regions=load_regions(config["regions"]), home_region=egress.home_region
        )
        policy = compile_policy(order["adl"], order["aaif"], schema_set(), datetime.now(UTC), options)
        if policy.digest != order["policy_digest"]:
            raise PlanError("the agent's policy changed while it was being launched; try again")
        joining.wait()  # before anything forks again
        cwd = enter_as_caller(order["cwd"], uid, gid)
        baseline, presets_applied = runtime_presets.extend(load_baseline(Path(config["baseline"])), order["adl"])
        plan = build_plan(
            policy,
            order["argv"],
            baseline=baseline,
            environ=order["environ"],
            features=sessions.host_features(),
            accept_unenforced=frozenset(order["accept_unenforced"]),
            cwd=cwd,
            pids_max=order["pids_max"],
            egress=egress,
        )
        mask_daemon_files(plan, Path(config["audit_dir"]), Path(config["audit_key"]))
        remove_session_tmp = runtime_presets.finish_plan(plan, presets_applied, uid=uid, gid=gid, explain_only=False)
    except (Refusal, OSError) as exc:
        with contextlib.suppress(AuditUnavailable):
            sessions.record_refusal(recorder, policy, session, str(exc), order["argv"])
        writer.close()
        report(reason="refused", exit_code=125, detail=str(exc))
        return 1

    def stop_when_caller_leaves() -> None:
        # adl-exec going away (Ctrl-C, SIGKILL) ends its session, as in embedded mode.
        with contextlib.suppress(OSError):
            while client.recv(4096):
                pass
        if prepared.group is not None:
            with contextlib.suppress(OSError):
                prepared.group.kill_all()

    def end_terminated(step: str) -> int:
        with contextlib.suppress(AuditUnavailable):
            sessions.record_refusal(recorder, policy, session, f"terminated by TerminateSession {step}", order["argv"])
        writer.close()
        report(reason="terminated", exit_code=128 + signal.SIGKILL, signal=signal.SIGKILL, detail=step)
        return 0

    threading.Thread(target=stop_when_caller_leaves, daemon=True).start()
    denials: dict[str, Any] = {}
    if terminated.is_set():
        return end_terminated("before the agent started")
    try:
        outcome = sessions.run_session(
            policy,
            plan,
            WithCaller(writer, uid, cwd),
            session,
            uid=None if uid == os.getuid() else uid,
            gid=None if uid == os.getuid() else gid,
            cgroup_group=config["cgroup_group"],
            prepared=prepared,
            on_denials=denials.update,
        )
    except (LaunchError, AuditUnavailable) as exc:
        remove_session_tmp()
        if terminated.is_set():  # the stage was killed under the launcher: not a failure to report
            return end_terminated(f"while the sandbox was set up ({exc})")
        with contextlib.suppress(AuditUnavailable):
            sessions.record_refusal(recorder, policy, session, str(exc), order["argv"])
        writer.close()
        report(reason="refused", exit_code=125, detail=str(exc))
        return 1
    writer.close()
    remove_session_tmp()
    report(
        reason=outcome.reason,
        exit_code=outcome.exit_code,
        signal=outcome.signal or 0,
        duration_ms=int(outcome.duration_s * 1000),
        creations_refused=outcome.guard_refused_total,
        kernel_denials_json=json.dumps(denials),
    )
    return 0
