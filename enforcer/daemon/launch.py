"""The launch socket: adl-exec --daemon connects here.

A plain unix socket, not gRPC, because the daemon must learn the caller's uid from the kernel
(SO_PEERCRED) and receive its stdin, stdout and stderr (SCM_RIGHTS). The agent runs as that uid.
The daemon decides here (who may launch the agent, known agent, what the caller may widen, the
bounds on sessions: max_concurrent, per uid, in all), registers the session, answers LaunchReply,
and hands the order to the spawner; the session's supervisor sends SessionEnded on this connection.
A refusal only the supervisor finds counts in its caller's launch refusals as the daemon's own do
(session_ended).

One thread reads every connection's request without blocking, so a caller that connects and sends
nothing, or trickles its request, holds a file descriptor until the whole-request deadline and no
thread. The accept loop outlives transient errors (no descriptors left, an aborted connection):
it backs off, logs and records the error, and goes on.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import logging
import os
import pwd
import resource
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..audit import AuditUnavailable, records
from ..audit.events import caller_fields, refused_members
from ..framing import MAX_FRAME, FrameError, peer_credentials, send_frame
from ..policy import Policy
from ..sandbox import DOMAINS
from ..session import record_refusal
from ..v1 import enforcer_pb2 as pb
from .auditsink import AuditSink
from .orders import REFUSAL_COUNTED, REFUSAL_RECORDED, LaunchOrder, OrderError
from .quota import UidBudget, record_overflows
from .registry import SessionBounds, SessionLimit, SessionRecord, SessionRegistry
from .spawner import SpawnerHandle
from .store import AgentEntry, PolicyStore

# How long a launch at a full bound (max_concurrent, per uid, in all) waits for a session that is
# ending (registry.py).
ENDING_SESSION_WAIT_S = 1.0
log = logging.getLogger("adl-enforcerd")
MAX_ARGV = 4096
DEFAULT_PIDS_MAX = 512
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
# accept() errors that say nothing about the listener itself: wait, then accept again.
TRANSIENT_ACCEPT = {
    errno.EMFILE,
    errno.ENFILE,
    errno.ENOBUFS,
    errno.ENOMEM,
    errno.ECONNABORTED,
    errno.EPROTO,
    errno.EINTR,
    errno.EAGAIN,
}
BACKOFF_S = (0.01, 1.0)  # first and longest pause after a transient accept() error
FD_RESERVE = 256  # descriptors the listeners' connections leave to everything else, at least
REPLY_S = 5.0  # sending LaunchReply (or a refusal) to a caller that does not read
# The bytes of unfinished requests held at once, over every connection: beyond it the connection
# holding the most goes (a real caller sends its request at once, and it is rarely that large).
PENDING_BYTES_MAX = 64 << 20
# Characters of a refused request's argv, and of its refusal's reason (which may quote the request),
# kept in its record: a refusal costs the caller nothing, so its record must not be as large as
# the request. What is cut is counted in the record.
REFUSAL_TEXT_MAX = 4096
# Refusals of one caller uid recorded in detail per window; beyond, counted only, and the count is in
# a summary record when the window ends (quota.py): one caller's flood must not fill the log every
# session shares.
REFUSALS_DETAILED = 100
REFUSAL_WINDOW_S = 60.0


@dataclass(frozen=True)
class LaunchLimits:
    """What the operator lets callers do (Settings: agent_callers, max_pids, allowed_unenforced)."""

    agent_callers: Mapping[str, Sequence[str]] = field(default_factory=dict)
    max_pids: int = 4096
    allowed_unenforced: frozenset[str] = frozenset()
    request_s: float = 5.0
    max_connections: int = 4096
    refusals_detailed: int = REFUSALS_DETAILED  # per caller uid and window
    refusal_window_s: float = REFUSAL_WINDOW_S
    sessions: SessionBounds = field(default_factory=SessionBounds)  # per uid, in all, tasks per uid


@dataclass(frozen=True)
class Caller:
    pid: int
    uid: int
    gid: int
    groups: tuple[int, ...]  # supplementary groups, from the kernel (SO_PEERGROUPS)


def peer_groups(sock: socket.socket) -> tuple[int, ...]:
    size = 64
    while True:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size * 4)
            return struct.unpack(f"{len(raw) // 4}I", raw)
        except OSError as exc:
            if exc.errno != errno.ERANGE or size >= 65536:
                raise
            size *= 4


def caller_of(conn: socket.socket, what: str) -> Caller | None:
    """Who is at the other end of an accepted unix connection, as the kernel names it; None (the
    connection closed, logged) when the kernel gives no credentials."""
    try:
        pid, uid, gid = peer_credentials(conn)
        return Caller(pid, uid, gid, peer_groups(conn))
    except OSError as exc:
        log.warning("%s connection without credentials: %s", what, exc)
        conn.close()
        return None


def _matches(rule: str, caller: Caller) -> bool:
    kind, _, name = rule.partition(":")
    try:
        if kind == "uid":
            return caller.uid == int(name)
        if kind == "user":
            return caller.uid == pwd.getpwnam(name).pw_uid
        if kind == "group":
            gid = grp.getgrnam(name).gr_gid
            return gid == caller.gid or gid in caller.groups
    except (KeyError, ValueError):  # a user or group that does not exist admits nobody
        return False
    return False


def listener_share() -> int | None:
    """The descriptors each of the two listeners (the API relay, the launch socket) may hold for its
    connections; None with no file limit. What the soft limit leaves beyond the daemon's own room
    (FD_RESERVE, or a quarter of the limit: the audit log and its rotation, gRPC, the spawner,
    session files) is split in halves, not shared: a flood of one socket's connections can take
    neither the other socket's callers' descriptors nor the daemon's."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - max(FD_RESERVE, soft // 4)) // 2


def record_accept_error(sink: Any, listener: str, exc: OSError, count: int) -> None:
    """Log a transient accept() error of `listener` ("launch", "api"), and record it in the audit log
    at the 1st, 2nd, 4th, 8th... error, so that a flood of them cannot flood the log."""
    log.error("the %s socket could not accept a connection (%s); accepting again after a pause", listener, exc)
    if sink is not None and count & (count - 1) == 0:
        with contextlib.suppress(AuditUnavailable):
            sink.append(
                records.REFUSED,
                {
                    **refused_members(f"{listener} socket accept() failed: {exc.strerror or exc}"),
                    "errno": errno.errorcode.get(exc.errno or 0, str(exc.errno)),
                    "accept_errors": count,
                },
                corr=listener,
                priority="high",
            )


def bounded_text(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def bounded_argv(argv: Sequence[str], limit: int) -> tuple[list[str], dict[str, int]]:
    """The arguments that fit in `limit` characters (the one crossing it cut), and, when some were
    cut, how many arguments and characters there were in all."""
    kept: list[str] = []
    room = limit
    for arg in argv:
        if len(arg) > room:
            if room:
                kept.append(arg[:room])
            total = sum(len(arg) for arg in argv)
            return kept, {"arguments": len(argv), "characters": total}
        kept.append(arg)
        room -= len(arg)
    return kept, {}


def may_launch(agent_callers: Mapping[str, Sequence[str]], entry: AgentEntry, caller: Caller) -> bool:
    """Root always; anyone else only as the operator's agent_callers say (by key, id, name or "*")."""
    if caller.uid == 0:
        return True
    names = {entry.key, entry.policy.agent_name, entry.policy.agent_id or "", "*"}
    rules = [rule for name, listed in agent_callers.items() if name in names for rule in listed]
    return any(_matches(rule, caller) for rule in rules)


class _Pending:
    """A connection whose request has not arrived whole yet."""

    def __init__(self, conn: socket.socket, caller: Caller, deadline: float) -> None:
        self.conn, self.caller, self.deadline = conn, caller, deadline
        self.data = bytearray()
        self.fds: list[int] = []

    def close(self) -> None:
        for fd in self.fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds = []
        self.conn.close()

    def frame(self) -> bytes | None:
        """The request, once it has all arrived."""
        if len(self.data) < 4:
            return None
        (size,) = struct.unpack("!I", self.data[:4])
        if size > MAX_FRAME:
            raise FrameError(f"message of {size} bytes exceeds {MAX_FRAME}")
        if len(self.data) < 4 + size:
            return None
        return bytes(self.data[4 : 4 + size])


class LaunchServer:
    def __init__(
        self,
        path: Path,
        store: PolicyStore,
        registry: SessionRegistry,
        sink: AuditSink,
        spawner: SpawnerHandle,
        serving: Callable[[], bool],
        limits: LaunchLimits | None = None,
    ) -> None:
        self.path = path
        self.store, self.registry, self.sink, self.spawner = store, registry, sink, spawner
        self.limits = limits or LaunchLimits()
        self._serving = serving
        self._listener: socket.socket | None = None
        self._stop = threading.Event()
        self._pending: dict[int, _Pending] = {}  # in the order they were accepted
        self._max_pending = self.limits.max_connections
        self._held = 0  # the bytes of the requests in _pending
        self._refusals = UidBudget(self.limits.refusals_detailed, self.limits.refusal_window_s)
        self.accept_errors = 0

    def start(self, mode: int, gid: int | None) -> None:
        self.path.unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        listener.bind(str(self.path))
        os.chmod(self.path, mode)
        if gid is not None:
            os.chown(self.path, -1, gid)
        listener.listen(256)
        listener.setblocking(False)
        # Waiting connections keep to the launch socket's share of descriptors: each holds its own
        # and the stdin, stdout and stderr it may have sent already.
        room = listener_share()
        if room is not None:
            self._max_pending = max(1, min(self._max_pending, room // (1 + 3)))
        self._listener = listener
        selector = selectors.DefaultSelector()  # made here: its descriptor is not one to run out of later
        selector.register(listener, selectors.EVENT_READ)
        threading.Thread(target=self._serve, args=(selector,), name="launch-requests", daemon=True).start()

    def summarize(self, now: float) -> int:
        """Write the summary of each uid's refusals counted only in a window that has ended."""
        return record_overflows(self.sink, self._refusals, now, "launch refusals", "refusals_counted_only", "launch")

    def stop(self) -> None:
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        self.path.unlink(missing_ok=True)

    # -- reading requests -------------------------------------------------------------------------

    def _serve(self, selector: selectors.BaseSelector) -> None:
        """Accept, and read every connection's request until it is whole or its deadline passes."""
        assert self._listener is not None
        resume_at = 0.0  # after a transient accept() error: when to accept again
        backoff = BACKOFF_S[0]
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                if resume_at and now >= resume_at:
                    resume_at = 0.0
                    selector.register(self._listener, selectors.EVENT_READ)
                for key, _ in selector.select(timeout=0.2):
                    if key.fileobj is self._listener:
                        if self._accept_all(selector):
                            backoff = BACKOFF_S[0]
                        else:  # a transient error: stop accepting for a while
                            selector.unregister(self._listener)
                            resume_at = time.monotonic() + backoff
                            backoff = min(backoff * 2, BACKOFF_S[1])
                    else:
                        self._read(selector, key.data)
                self._expire(selector, time.monotonic())
        except OSError as exc:  # the listener was closed by stop()
            if not self._stop.is_set():
                log.error("the launch socket stopped: %s", exc)
        finally:
            for pending in list(self._pending.values()):
                pending.close()
            self._pending.clear()
            self._held = 0
            selector.close()

    def _accept_all(self, selector: selectors.BaseSelector) -> bool:
        """Accept what is waiting; False after a transient error (the caller backs off)."""
        assert self._listener is not None
        for _ in range(64):  # then look at the connections already accepted
            try:
                conn, _ = self._listener.accept()
            except BlockingIOError:
                return True
            except OSError as exc:
                if exc.errno not in TRANSIENT_ACCEPT:
                    raise
                self._accept_failed(exc)
                return False
            caller = caller_of(conn, "launch")
            if caller is None:
                continue
            if len(self._pending) >= self._max_pending:
                # The oldest goes: a real caller sends its request at once, so the oldest is the
                # likeliest to be idle, and a flood of idle connections only pushes out its own.
                oldest = next(iter(self._pending.values()))
                log.warning(
                    "launch connection from uid %d closed: %d connections wait for their request",
                    oldest.caller.uid,
                    len(self._pending),
                )
                self._drop(selector, oldest)
            conn.setblocking(False)
            pending = _Pending(conn, caller, time.monotonic() + self.limits.request_s)
            self._pending[conn.fileno()] = pending
            selector.register(conn, selectors.EVENT_READ, pending)
        return True

    def _accept_failed(self, exc: OSError) -> None:
        self.accept_errors += 1
        record_accept_error(self.sink, "launch", exc, self.accept_errors)

    def _read(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(pending.conn, 1 << 16, 3, socket.MSG_CMSG_CLOEXEC)
        except BlockingIOError:
            return
        except OSError as exc:
            log.warning("launch connection from uid %d failed: %s", pending.caller.uid, exc)
            self._drop(selector, pending)
            return
        pending.fds.extend(fds)
        if not data:
            self._drop(selector, pending)
            return
        pending.data += data
        self._held += len(data)
        try:
            request = pending.frame()
            if len(pending.fds) > 3:
                raise FrameError("more than three descriptors attached")
            if flags & socket.MSG_CTRUNC:  # too many for the buffer, or none left in this process to take them
                raise FrameError("its descriptors could not all be received (more than three, or no room here)")
        except FrameError as exc:
            log.warning("launch connection from uid %d: %s", pending.caller.uid, exc)
            self._drop(selector, pending)
            return
        if request is None:
            self._hold_at_most(selector, PENDING_BYTES_MAX)
            return
        selector.unregister(pending.conn)
        del self._pending[pending.conn.fileno()]
        self._held -= len(pending.data)
        try:
            threading.Thread(target=self._handle, args=(pending, request), name="launch", daemon=True).start()
        except RuntimeError as exc:  # out of tasks: this request fails, the socket serves on
            log.warning("launch connection from uid %d closed: no thread to handle it: %s", pending.caller.uid, exc)
            pending.close()

    def _expire(self, selector: selectors.BaseSelector, now: float) -> None:
        for pending in [p for p in self._pending.values() if p.deadline <= now]:
            log.warning(
                "launch connection from uid %d closed: no whole request within %.1f s",
                pending.caller.uid,
                self.limits.request_s,
            )
            self._drop(selector, pending)

    def _hold_at_most(self, selector: selectors.BaseSelector, limit: int) -> None:
        """Drop the connections holding the most until the unfinished requests' bytes fit `limit`."""
        while self._held > limit and self._pending:
            largest = max(self._pending.values(), key=lambda pending: len(pending.data))
            log.warning(
                "launch connection from uid %d closed: %d bytes of unfinished requests held, %d of them its own",
                largest.caller.uid,
                self._held,
                len(largest.data),
            )
            self._drop(selector, largest)

    def _drop(self, selector: selectors.BaseSelector, pending: _Pending) -> None:
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(pending.conn)
        if self._pending.pop(pending.conn.fileno(), None) is pending:
            self._held -= len(pending.data)
        pending.data = bytearray()
        pending.close()

    # -- deciding -------------------------------------------------------------------------------

    def _handle(self, pending: _Pending, data: bytes) -> None:
        conn, fds = pending.conn, pending.fds
        pending.fds = []
        try:
            conn.setblocking(True)
            conn.settimeout(REPLY_S)
            try:
                request = pb.LaunchRequest.FromString(data)
            except Exception:
                self._refuse(conn, pending.caller, "the launch request is not a valid LaunchRequest", [], "")
                return
            self._launch(conn, request, fds, pending.caller)
        except (OSError, FrameError) as exc:
            log.warning("launch connection failed: %s", exc)
        finally:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            conn.close()

    def _widening_refused(self, request: pb.LaunchRequest) -> str | None:
        """Why what the caller asks to widen is beyond the operator's configuration, or None."""
        if request.pids_max > self.limits.max_pids:
            return f"pids_max {request.pids_max} exceeds the operator's max_pids of {self.limits.max_pids}"
        accepted = set(request.accept_unenforced)
        unknown = accepted - set(DOMAINS)
        if unknown:
            return f"accept_unenforced takes {', '.join(DOMAINS)}; not {', '.join(sorted(unknown))}"
        beyond = accepted - self.limits.allowed_unenforced
        if beyond:
            allowed = ", ".join(sorted(self.limits.allowed_unenforced)) or "none"
            return (
                f"accepting {', '.join(sorted(beyond))} unenforced is not allowed by the operator "
                f"(allowed_unenforced: {allowed})"
            )
        return None

    def _launch(self, conn: socket.socket, request: pb.LaunchRequest, fds: list[int], caller: Caller) -> None:
        argv = list(request.argv)
        cwd = request.cwd or "/"
        if len(fds) != 3:
            self._refuse(conn, caller, "attach stdin, stdout and stderr to the launch request", argv, cwd)
            return
        if not argv or len(argv) > MAX_ARGV:
            self._refuse(conn, caller, f"argv must hold 1 to {MAX_ARGV} arguments", argv, cwd)
            return
        if not os.path.isabs(cwd) or "\0" in cwd or len(cwd) > 4096:
            self._refuse(conn, caller, "cwd must be an absolute path", argv, cwd)
            return
        if not self._serving():
            self._refuse(conn, caller, "the daemon is not serving (audit log or policies unavailable)", argv, cwd)
            return
        entry = self.store.snapshot.resolve(request.agent)
        if entry is None:
            self._refuse(conn, caller, f"no policy is loaded for agent {request.agent!r}", argv, cwd)
            return
        if caller.uid == 0 or caller.gid == 0:  # refused here too, before a session slot is taken
            reason = "the agent never runs as host root: launch from the account the agent should run as"
            self._refuse(conn, caller, reason, argv, cwd, entry.policy)
            return
        if not may_launch(self.limits.agent_callers, entry, caller):
            reason = f"uid {caller.uid} may not launch agent {entry.key!r} (the operator's agent_callers)"
            self._refuse(conn, caller, reason, argv, cwd, entry.policy)
            return
        widening = self._widening_refused(request)
        if widening is not None:
            self._refuse(conn, caller, widening, argv, cwd, entry.policy)
            return
        limits = entry.policy.limits
        pids_max = request.pids_max or DEFAULT_PIDS_MAX
        try:
            session = self.registry.register(
                entry.key,
                limits.max_concurrent if limits else None,
                caller.uid,
                caller.gid,
                tuple(argv),
                int(time.time() * 1000),
                wait_s=ENDING_SESSION_WAIT_S,
                bounds=self.limits.sessions,
                pids_max=pids_max,
            )
        except SessionLimit as exc:
            self._refuse(conn, caller, str(exc), argv, cwd, entry.policy)
            return
        # A unit of the caller's refusal budget for the refusal its supervisor may find (given back
        # when the session ends without one): taken ahead, so that a caller's launches in flight
        # cannot all find room in its budget and each write a refusal in detail.
        session.refusal_detailed, session.refusal_slot = self._refusals.reserve(caller.uid, time.monotonic())
        try:
            order = LaunchOrder(
                session=session.session,
                agent=entry.key,
                adl=entry.adl_document,
                aaif=entry.aaif_document,
                policy_digest=entry.policy.digest,
                argv=tuple(argv),
                environ=dict(request.environ),
                cwd=cwd,
                uid=caller.uid,
                gid=caller.gid,
                accept_unenforced=tuple(request.accept_unenforced),
                pids_max=pids_max,
                refusal_detailed=session.refusal_detailed,
            )
        except OrderError as exc:  # what the checks above let through, the order refuses too
            self._ended_here(session)
            self._refuse(conn, caller, str(exc), argv, cwd, entry.policy)
            return
        try:
            send_frame(
                conn,
                pb.LaunchReply(
                    accepted=True,
                    session=session.session,
                    session_token=session.token,
                    policy_digest=entry.policy.digest,
                ).SerializeToString(),
            )
            conn.settimeout(None)  # the supervisor owns the connection from here
            if not self.spawner.launch(order, [*fds, conn.fileno()], lambda: session.terminating):
                # The operator's doing, not a refusal of the caller's: recorded whatever its budget.
                self._ended_here(session)
                detail = "terminated by TerminateSession before the agent started"
                with contextlib.suppress(AuditUnavailable):
                    record_refusal(
                        self.sink, entry.policy, session.session, detail, argv, caller_fields(caller.uid, cwd)
                    )
                send_frame(
                    conn,
                    pb.SessionEnded(
                        session=session.session, reason="terminated", exit_code=137, signal=9, detail=detail
                    ).SerializeToString(),
                )
        except (OSError, FrameError) as exc:
            self._ended_here(session)
            with contextlib.suppress(OSError, FrameError):
                send_frame(
                    conn,
                    pb.SessionEnded(
                        session=session.session, reason="refused", exit_code=125, detail=f"spawner unavailable: {exc}"
                    ).SerializeToString(),
                )

    def _ended_here(self, session: SessionRecord, status: int = 1) -> None:
        """A session that ends before the spawner had its order (exit `status` as a supervisor's);
        accounted for here only if the spawner's report of its end has not been already."""
        if self.registry.end(session.session) is not None:
            self.session_ended(session, status)

    def session_ended(self, session: SessionRecord, status: int) -> None:
        """Account for how a session ended in its caller's refusal budget: a refusal its supervisor
        recorded keeps the unit reserved for it (or, recorded without one, costs one more), one it
        withheld is counted for the summary, and any other end gives the unit back."""
        now = time.monotonic()
        if status == REFUSAL_COUNTED:
            if self._refusals.count(session.uid, now) == 1:
                with contextlib.suppress(AuditUnavailable):
                    self._counting_begins(session.uid)
        elif status == REFUSAL_RECORDED:
            if not session.refusal_detailed:  # after its launch record: recorded all the same
                self._refusals.add(session.uid, now, 1)
        elif session.refusal_slot is not None:
            self._refusals.release(session.uid, session.refusal_slot, now)
        session.refusal_slot = None  # once: an end is accounted for once

    def _counting_begins(self, uid: int) -> None:
        """Say in the log that the uid's refusals are counted only from now on in this window."""
        window = self._refusals.window_s
        self.sink.append(
            records.REFUSED,
            {
                **refused_members(
                    f"more than {self._refusals.capacity} launch refusals of uid {uid} within "
                    f"{window:g} s: the rest of the window's are counted, in a summary when it ends"
                ),
                "caller_uid": uid,
            },
            corr="launch",
            priority="high",
        )

    def _refuse(
        self,
        conn: socket.socket,
        caller: Caller,
        reason: str,
        argv: list[str],
        cwd: str,
        policy: Policy | None = None,
    ) -> None:
        reason = bounded_text(reason, REFUSAL_TEXT_MAX)
        detailed, counted = self._refusals.take(caller.uid, time.monotonic())
        with contextlib.suppress(AuditUnavailable):
            if detailed:
                kept, cut = bounded_argv(argv, REFUSAL_TEXT_MAX)
                fields = caller_fields(caller.uid, bounded_text(cwd, REFUSAL_TEXT_MAX))
                if cut:
                    fields["argv_cut"] = cut
                record_refusal(self.sink, policy, "launch", reason, kept, fields)
            elif counted == 1:  # the log says when it stops detailing this uid's refusals
                self._counting_begins(caller.uid)
        with contextlib.suppress(OSError, FrameError):
            send_frame(conn, pb.LaunchReply(accepted=False, refusal=reason).SerializeToString())
