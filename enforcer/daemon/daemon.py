"""adl-enforcerd wiring: audit log, leftover sessions, policy store, gRPC servers, launch socket,
systemd notifications and the main loop (reload on SIGHUP, approvals expiry, audit recovery).

Import only after spawner.start(): this module imports grpc.
"""

from __future__ import annotations

import contextlib
import grp
import logging
import math
import os
import select
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ..audit import AuditUnavailable, WriterSettings, records
from ..documents import PolicyFileError, load_regions, schema_set
from ..policy import CompileOptions
from ..sandbox import cgroups
from ..v1 import enforcer_pb2 as pb
from . import notify
from .approvals import Approvals
from .arguments import ArgumentLimits
from .auditsink import AuditSink
from .callers import CallerRelay, CallerTable
from .config import Settings, as_plain
from .core import Core
from .inline import InlineUnary, InlineUnavailable
from .launch import LaunchLimits, LaunchServer
from .orders import SessionStarted
from .quota import UidBudget
from .registry import SessionBounds, SessionRegistry
from .service import AdminService, EnforcerService, handlers, inline_handlers
from .spawner import AGENTS_TASKS_SHARE, SpawnerHandle, remove_helper_groups
from .store import PolicyStore, ReloadResult, UnsafePolicyDirectory
from .threads import TaskLimitedPool

log = logging.getLogger("adl-enforcerd")
VERSION = "0.1.0"
SERVICES = ("enforcer.v1.Enforcer", "enforcer.v1.Admin")
CHECK_BATCH = f"/{SERVICES[0]}/CheckBatch"
TICK_S = 0.1
SPAWNER_EXIT_S = 5.0  # how long a stopping daemon waits for its spawner to clean up and exit
# Checks larger than this are decided on a thread beside the inline loop, not on it (see inline.py):
# the usual Check is far smaller, and deciding one this size with PII at every turn would hold up
# every request that arrived with it.
LARGE_REQUEST_BYTES = 4096


class StartupError(Exception):
    pass


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class Daemon:
    def __init__(self, settings: Settings, spawner: SpawnerHandle, systemd: notify.Systemd) -> None:
        self.settings = settings
        self.systemd = systemd
        self.spawner = spawner
        self.health = health.HealthServicer()
        for name in ("", *SERVICES):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        self.registry = SessionRegistry()
        self.approvals = Approvals(
            _now_ms,
            settings.max_pending_approvals,
            per_agent=settings.max_pending_per_agent,
            per_uid=settings.max_pending_per_uid,
        )
        self.sink = AuditSink(
            settings.audit_dir,
            settings.audit_key,
            WriterSettings(
                group_ms=settings.audit_group_ms,
                group_records=settings.audit_group_records,
                background_flush=True,
            ),
            on_change=lambda _ok: self._update_health(),
            retry_s=settings.audit_retry_s,
            write_deadline_s=settings.audit_write_deadline_s,
        )
        try:
            options = CompileOptions(
                production=settings.production,
                regions=load_regions(settings.regions),
                home_region=settings.home_region,
            )
            self.store = PolicyStore(settings.policy_dir, schema_set(settings.spec_dir), options)
            self.store.check_directory()
        except (PolicyFileError, UnsafePolicyDirectory) as exc:
            raise StartupError(str(exc)) from exc
        limits = ArgumentLimits(settings.max_argument_depth, settings.max_argument_items, settings.max_argument_string)
        self.callers = CallerTable()
        self.core = Core(
            self.store,
            self.sink,
            self.registry,
            self.approvals,
            _now_ms,
            limits,
            self.callers,
            settings.agent_callers,
            UidBudget(settings.check_audit_bytes_per_uid, settings.audit_budget_window_s, exempt=frozenset({0})),
        )
        self._relay = CallerRelay(
            settings.socket,
            CallerRelay.internal_path(settings.socket),
            self.callers,
            settings.max_api_connections,
            settings.api_request_s,
            self.sink,
            max_unfinished_per_uid=max(1, settings.workers // 4),
        )
        self._servers: list[grpc.Server] = []
        self._pools: list[TaskLimitedPool] = []  # the servers' worker threads
        self._telemetry: list[Any] = []  # what enforcer.daemon.telemetry opened (off by default)
        self._bound: dict[Path, tuple[int, int]] = {}  # socket path -> (st_dev, st_ino) of the socket we made
        self._inline: InlineUnary | None = None
        self._launch: LaunchServer | None = None
        self._reload_wanted = threading.Event()
        self._stop_wanted = threading.Event()
        self._reload_lock = threading.Lock()
        self._serving = False
        self._started = False  # every socket is listening: health may say SERVING from then on

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        try:
            self.sink.open()
        except AuditUnavailable as exc:
            raise StartupError(str(exc)) from exc
        self.sink.append(
            records.DAEMON_START,
            {"pid": os.getpid(), "version": VERSION, "config": as_plain(self.settings)},
            priority="high",
            sync=True,
        )
        self._reap_leftover_sessions()
        self.reload()
        if self.settings.metrics_listen or self.settings.otel:
            try:
                from . import telemetry

                self._telemetry = telemetry.install(self)
            except (ImportError, OSError, ValueError) as exc:
                raise StartupError(f"telemetry (metrics_listen, otel) cannot start: {exc}") from exc
        group = self._socket_gid()
        # gRPC listens where only root reaches it; the API socket is the relay that names each caller.
        try:
            self._relay.prepare_internal()
        except OSError as exc:
            raise StartupError(str(exc)) from exc
        self._servers.append(self._grpc_server(self._relay.internal, 0o600, None, admin=False))
        self._relay.start(0o660, group)
        self._servers.append(self._grpc_server(self.settings.admin_socket, 0o600, None, admin=True))
        bounds = self._session_bounds()
        if bounds.tasks_per_uid is not None and self.settings.max_pids > bounds.tasks_per_uid:
            log.warning(
                "max_pids (%d) exceeds one uid's share of the sessions' tasks on this host (%d, "
                "session_tasks_share_per_uid): launches asking for more are refused",
                self.settings.max_pids,
                bounds.tasks_per_uid,
            )
        self._launch = LaunchServer(
            self.settings.launch_socket,
            self.store,
            self.registry,
            self.sink,
            self.spawner,
            lambda: self._serving,
            LaunchLimits(
                agent_callers=self.settings.agent_callers,
                max_pids=self.settings.max_pids,
                allowed_unenforced=frozenset(self.settings.allowed_unenforced),
                request_s=self.settings.launch_request_s,
                max_connections=self.settings.max_launch_connections,
                refusals_detailed=self.settings.launch_refusals_per_uid,
                refusal_window_s=self.settings.audit_budget_window_s,
                sessions=bounds,
            ),
        )
        self._launch.start(0o660, group)
        threading.Thread(target=self._spawner_events, name="spawner-events", daemon=True).start()
        self._started = True
        self._update_health()
        self.systemd.send("READY=1", self._status_line())

    def _session_bounds(self) -> SessionBounds:
        """The operator's bounds on sessions; a uid's tasks as its share of all sessions' (spawner.py)."""
        sessions_tasks = cgroups.host_tasks() * AGENTS_TASKS_SHARE
        return SessionBounds(
            per_uid=self.settings.max_sessions_per_uid,
            total=self.settings.max_sessions,
            tasks_per_uid=int(sessions_tasks * self.settings.session_tasks_share_per_uid),
        )

    def run_forever(self) -> None:
        watchdog_s = self.systemd.watchdog_s
        last_ping = 0.0
        last_sweep = 0.0
        while not self._stop_wanted.wait(TICK_S):
            now = time.monotonic()
            if self._reload_wanted.is_set():
                self._reload_wanted.clear()
                self.systemd.send("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
                self.reload()
                self.systemd.send("READY=1", self._status_line())
            self.sink.tick()  # first: a stalled log must be noticed even if expiring approvals waits on it
            self.core.expire_due()
            # Each uid's requests counted only, written as soon as their window ends.
            self.core.summarize(now)
            if self._launch is not None:
                self._launch.summarize(now)
            for pool in self._pools:  # threads that could not start for lack of tasks, once there are
                pool.catch_up()
            if now - last_sweep > 60:
                self.approvals.forget_resolved(older_than_ms=3_600_000)
                last_sweep = now
            # No ping while the log makes no progress: systemd then restarts a daemon stuck for WatchdogSec.
            if watchdog_s and now - last_ping >= watchdog_s / 2 and not self.sink.stalled:
                self.systemd.send("WATCHDOG=1", self._status_line())
                last_ping = now

    def request_reload(self, *_: Any) -> None:
        self._reload_wanted.set()

    def request_stop(self, *_: Any) -> None:
        self._stop_wanted.set()

    def stop(self) -> None:
        self._stop_wanted.set()  # whatever ended run_forever: the spawner's end below is expected
        self.systemd.send("STOPPING=1")
        self._serving = False
        for name in ("", *SERVICES):
            self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._launch is not None:
            self._launch.stop()
        self._relay.stop_accepting()
        self.core.end_pending("the daemon stopped")  # each outcome recorded; waiters answered DENY now
        self.approvals.close()
        ended = self._end_sessions(timeout_s=5.0)
        for server in self._servers:
            server.stop(grace=2).wait(3)
        self._relay.close()
        if self._inline is not None:
            self._inline.stop()
        for path in (self.settings.socket, self.settings.admin_socket):
            self._unlink_own(path)
        self._relay.internal.unlink(missing_ok=True)
        if self._telemetry:
            from . import telemetry

            telemetry.close(self._telemetry)
        with contextlib.suppress(OSError):
            self._relay.internal.parent.rmdir()
        # Counts of windows still open are written now: a stop must not lose them.
        self.core.summarize(math.inf)
        if self._launch is not None:
            self._launch.summarize(math.inf)
        with contextlib.suppress(AuditUnavailable):
            self.sink.append(records.DAEMON_STOP, {"pid": os.getpid(), "sessions_ended": ended}, priority="high")
        self.sink.close()
        with contextlib.suppress(OSError):
            # shutdown first: the spawner-events thread's recv holds the socket open past close()
            self.spawner.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self.spawner.sock.close()
        if self._wait_for_spawner(SPAWNER_EXIT_S):
            # A spawner killed before (SIGKILL) could not remove what it held: its prepared
            # supervisors' cgroup and the helpers' directories, emptied as they died with it.
            remove_helper_groups(self.settings.cgroup_group)

    def _wait_for_spawner(self, timeout_s: float) -> bool:
        """Let the spawner, which sees its socket closed, end its prepared supervisors and remove
        their cgroup and the helpers' directories: it dies with this process, maybe half way.
        Whether it has ended."""
        try:
            pidfd = os.pidfd_open(self.spawner.pid)
        except ProcessLookupError:  # gone and collected already
            return True
        except OSError:  # no pidfds: whether it ended is unknown
            return False
        try:
            ended = bool(select.select([pidfd], [], [], timeout_s)[0])
        finally:
            os.close(pidfd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.spawner.pid, os.WNOHANG)
        return ended

    # -- policies -------------------------------------------------------------------------------

    def reload(self) -> pb.ReloadResponse:
        with self._reload_lock:
            result = self.store.reload()
            self._audit_reload(result)
        self._update_health()
        snapshot = result.snapshot
        return pb.ReloadResponse(
            agents=len(snapshot.agents),
            changed=list(result.changed),
            problems=[pb.DocumentProblem(path=p.path, detail=p.detail, codes=list(p.codes)) for p in snapshot.problems],
            generation=snapshot.generation,
        )

    def _audit_reload(self, result: ReloadResult) -> None:
        snapshot = result.snapshot
        with contextlib.suppress(AuditUnavailable):
            for key in result.changed:
                entry = snapshot.agents[key]
                self.sink.append(
                    records.POLICY_LOAD,
                    {
                        "agent": key,
                        "decision": "allow",
                        "policy_digest": entry.policy.digest,
                        "path": str(entry.adl_path),
                        "aaif_path": str(entry.aaif_path) if entry.aaif_path else None,
                        "generation": snapshot.generation,
                    },
                )
            for key in result.removed:
                self.sink.append(
                    records.POLICY_LOAD, {"agent": key, "removed": True, "generation": snapshot.generation}
                )
            for problem in snapshot.problems:
                log.error("policy problem: %s: %s", problem.path, problem.detail)
                self.sink.append(
                    records.POLICY_LOAD,
                    {
                        "decision": "deny",
                        "path": problem.path,
                        "problem": problem.detail,
                        "codes": list(problem.codes),
                        "generation": snapshot.generation,
                    },
                    priority="high",
                )
            self.sink.sync()

    # -- sessions -------------------------------------------------------------------------------

    def _reap_leftover_sessions(self) -> None:
        """Sessions of an instance that stopped uncleanly: their supervisor is gone, so nobody would
        enforce the wall clock or record their end. Kill them and say so."""
        try:
            leftovers = cgroups.existing(group=self.settings.cgroup_group)
        except OSError as exc:
            log.warning("cannot look for leftover sessions: %s", exc)
            return
        for session, group in leftovers.items():
            members = group.members()
            try:
                group.remove(timeout=5)
                removed = True
            except OSError as exc:
                log.error("leftover session %s not removed: %s", session, exc)
                removed = False
            self.sink.append(
                records.SESSION_REAPED,
                {"session": session, "killed_pids": members, "removed": removed, "decision": "deny"},
                corr=session,
                priority="high",
                sync=True,
            )

    def terminate(self, session: str) -> bool:
        record = self.registry.get(session)
        if record is not None and self.spawner.sock.fileno() >= 0:
            # Its supervisor ends it at whatever step it is and reports "terminated" to the caller.
            with contextlib.suppress(OSError):
                self.spawner.terminate(session, lambda: setattr(record, "terminating", True))
                return True
        group = cgroups.existing(group=self.settings.cgroup_group).get(session)
        if group is None:
            return False
        group.kill_all()
        return True

    def _end_sessions(self, timeout_s: float) -> int:
        running = self.registry.all()
        for record in running:
            with contextlib.suppress(OSError):
                self.terminate(record.session)
        deadline = time.monotonic() + timeout_s
        while self.registry.all() and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(running)

    def _spawner_events(self) -> None:
        for event in self.spawner.events():
            try:
                if isinstance(event, SessionStarted):
                    self.registry.set_pid(event.session, event.pid)
                else:
                    record = self.registry.end(event.session)
                    if record is not None and self._launch is not None:
                        self._launch.session_ended(record, event.status)
            except Exception:  # a bug in one report's handling must not leave every later session unended
                log.exception("the spawner's report %r could not be handled", event)
        if not self._stop_wanted.is_set():
            log.error("the spawner stopped; launches are refused until the daemon restarts")
            with contextlib.suppress(OSError):
                self.spawner.sock.close()  # fileno() is now -1: _update_health keeps launches off
            self._update_health()

    # -- status and health ----------------------------------------------------------------------

    def status(self) -> pb.StatusResponse:
        snapshot = self.store.snapshot
        counts: dict[str, int] = {}
        sessions = self.registry.all()
        for s in sessions:
            counts[s.agent] = counts.get(s.agent, 0) + 1
        agents = []
        for key, entry in sorted(snapshot.agents.items()):
            limits = entry.policy.limits
            agents.append(
                pb.AgentStatus(
                    key=key,
                    name=entry.policy.agent_name,
                    id=entry.policy.agent_id or "",
                    policy_digest=entry.policy.digest,
                    source=str(entry.adl_path),
                    sessions=counts.get(key, 0),
                    max_concurrent=limits.max_concurrent if limits and limits.max_concurrent is not None else -1,
                )
            )
        return pb.StatusResponse(
            version=VERSION,
            serving=self._serving,
            audit_log_id=self.sink.log_id,
            audit_error=self.sink.error or "",
            policy_generation=snapshot.generation,
            agents=agents,
            problems=[pb.DocumentProblem(path=p.path, detail=p.detail, codes=list(p.codes)) for p in snapshot.problems],
            sessions=[
                pb.SessionInfo(
                    session=s.session,
                    agent=s.agent,
                    uid=s.uid,
                    argv=list(s.argv),
                    started_unix_ms=s.started_ms,
                    pid=s.pid,
                )
                for s in sessions
            ],
            pending_approvals=len(self.approvals.pending()),
        )

    def _update_health(self) -> None:
        spawner_alive = self.spawner.sock.fileno() >= 0
        ok = self._started and self.sink.healthy and bool(self.store.snapshot.agents) and not self._stop_wanted.is_set()
        self._serving = ok and spawner_alive
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICES):
            self.health.set(name, status)
        if self._servers:
            self.systemd.send(self._status_line())

    def _status_line(self) -> str:
        snapshot = self.store.snapshot
        if not self.sink.healthy:
            return f"STATUS=NOT SERVING: audit log unavailable: {self.sink.error}"
        if not snapshot.agents:
            return f"STATUS=NOT SERVING: no policy loaded from {self.settings.policy_dir}"
        problems = f", {len(snapshot.problems)} document(s) with problems" if snapshot.problems else ""
        directory = next((p.detail for p in snapshot.problems if p.path == str(self.settings.policy_dir)), None)
        if directory is not None:
            problems = f": {directory}"
        return f"STATUS=serving {len(snapshot.agents)} agent(s){problems}, {len(self.registry.all())} session(s)"

    # -- sockets --------------------------------------------------------------------------------

    def _unlink_own(self, path: Path) -> None:
        """Remove a socket only if it is still the one this daemon made."""
        with contextlib.suppress(OSError):
            st = path.lstat()
            if self._bound.get(path) == (st.st_dev, st.st_ino):
                path.unlink()

    def _uid_of(self, peer: bytes | str) -> int | None:
        """The uid of an API call's caller (None: not a relayed connection of this daemon's)."""
        caller = self.callers.of(peer)
        return None if caller is None else caller.uid

    def _socket_gid(self) -> int | None:
        if self.settings.socket_group is None:
            return None
        try:
            return grp.getgrnam(self.settings.socket_group).gr_gid
        except KeyError:
            raise StartupError(f"socket_group {self.settings.socket_group!r}: no such group") from None

    def _grpc_server(self, path: Path, mode: int, gid: int | None, *, admin: bool, inline: bool = True) -> grpc.Server:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        path.unlink(missing_ok=True)
        # WaitApproval holds a thread while it waits: its own max_approval_waits of them.
        pool = TaskLimitedPool(
            max_workers=self.settings.workers + self.settings.max_approval_waits,
            thread_name_prefix="admin" if admin else "api",
        )
        self._pools.append(pool)
        server = grpc.server(
            pool,
            options=[
                ("grpc.max_receive_message_length", max(self.settings.max_request_bytes * 4, 4 << 20)),
                ("grpc.so_reuseport", 0),
            ],
        )
        limit = self.settings.max_request_bytes
        enforcer = EnforcerService(
            self.core, self.status, self.settings.max_approval_waits, admin=admin, presets_catalog=self.settings.presets
        )
        # The generic handlers cover every method; on the API socket the inline loop takes Check and
        # CheckBatch first (the core routes a registered method's calls only to it).
        server.add_generic_rpc_handlers((handlers(enforcer, "Enforcer", limit),))
        if not admin and not self.settings.inline_check:
            log.info("Check and CheckBatch are served by the gRPC worker threads (inline_check is off)")
        elif not admin and inline:
            try:
                self._inline = InlineUnary(
                    server,
                    inline_handlers(enforcer, limit),
                    name="api-inline",
                    nice=self.settings.inline_nice,
                    with_peers=True,
                    large_bytes=LARGE_REQUEST_BYTES,
                    refused_bytes=limit,
                    large_owner=self._uid_of,
                )
            except InlineUnavailable as exc:
                log.warning("Check and CheckBatch are served by the gRPC worker threads (slower): %s", exc)
        if admin:
            admin_service = AdminService(self.core, self.reload, self.terminate, self.status)
            server.add_generic_rpc_handlers((handlers(admin_service, "Admin", limit),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        names = [*(SERVICES if admin else SERVICES[:1]), health.SERVICE_NAME, reflection.SERVICE_NAME]
        reflection.enable_server_reflection(names, server)
        old = os.umask(0o177)  # the socket appears with no access for others, then gets its mode
        try:
            if server.add_insecure_port(f"unix:{path}") == 0:
                raise StartupError(f"cannot listen on {path}")
            server.start()
        finally:
            os.umask(old)
        if not admin and self._inline is not None:
            try:
                self._inline.start()
                # An empty batch: answered with a message, and nothing is decided or recorded.
                self._inline.probe(f"unix:{path}", CHECK_BATCH, b"")
            except InlineUnavailable as exc:
                log.warning("Check and CheckBatch are served by the gRPC worker threads (slower): %s", exc)
                server.stop(None)
                self._inline.stop()
                self._inline = None
                self._pools.remove(pool)
                return self._grpc_server(path, mode, gid, admin=False, inline=False)
            log.info("Check and CheckBatch are served on the inline loop (nice %s)", self._inline.nice)
        os.chmod(path, mode)
        if gid is not None:
            os.chown(path, -1, gid)
        st = path.lstat()
        self._bound[path] = (st.st_dev, st.st_ino)
        return server


def serve(settings: Settings, spawner: SpawnerHandle, systemd: notify.Systemd) -> int:
    daemon = Daemon(settings, spawner, systemd)
    signal.signal(signal.SIGHUP, daemon.request_reload)
    signal.signal(signal.SIGTERM, daemon.request_stop)
    signal.signal(signal.SIGINT, daemon.request_stop)
    try:
        daemon.start()
    except StartupError:
        daemon.sink.close()
        raise
    log.info("serving on %s (admin %s, launch %s)", settings.socket, settings.admin_socket, settings.launch_socket)
    try:
        daemon.run_forever()
    finally:
        daemon.stop()
    return 0
