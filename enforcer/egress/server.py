"""The egress filter's serving half: what its process loads and does once it has said "ready".

The launch goes on as soon as the agent's namespace and its listeners exist (process.py); the
kernel queues what the agent sends meanwhile. Here the filter opens its own audit writer, records
`net.start`, and only then accepts and answers, so nothing is served before it can be recorded.
The connection filter and its thread pool are made at the first TCP connection, and dnspython is
loaded at the first name to resolve or query to parse (dns.py): a session that never uses the
network loads neither. The first TCP connection also starts the connection loop (loop.py) on a pool
thread: from then on it accepts the TCP connections and steps each one (filter.py), and serve()
watches only DNS and the launcher.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import os
import select
import selectors
import socket
import struct
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..audit import AuditUnavailable, AuditWriter, WriterSettings
from ..audit.events import agent_of, one_rule
from ..egress_values import EgressValues
from ..policy import Policy
from . import netns
from .dns import DnsStub, SyntheticAddresses, UpstreamResolver
from .loop import Loop

if TYPE_CHECKING:
    from concurrent.futures import Executor, Future

    from .filter import ConnectionFilter

# Refused DNS names and connections written one by one per session; later ones are counted by rule
# in net.summary, as kernel denials are: the agent chooses how many it makes, and the log is shared.
MAX_DETAILED_DENIALS = 1000
MAX_PENDING_QUERIES = 256  # DNS queries waiting for an answer; more are dropped (clients retry)
# Accepting, when the process is out of descriptors or memory: the pause before trying again.
ACCEPT_BACKOFF_S = 0.05
# The stop's wait for each of: the loop to accept no more, the connections' handlers, the pool
# threads' records, the loop's end.
STOP_WAIT_S = 5.0
ACCEPT_BATCH = 64  # connections the loop accepts at one wake before it serves the others' events
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# A session's connection totals before its first connection (ConnectionFilter.stats starts so).
NO_CONNECTIONS = {"connections": 0, "allowed": 0, "denied": 0, "bytes_out": 0, "bytes_in": 0}


def serve(
    control: socket.socket,
    space: netns.AgentNamespace,
    policy: Policy,
    settings: EgressValues,
    audit: tuple[Path, Path, WriterSettings],
    session: str,
    started: dict[str, Any],
) -> None:
    """Record net.start, serve until the launcher says stop, record net.summary and send the summary.
    `policy` already knows the host's addresses; `audit`: the log's directory, key and settings."""
    directory, key_path, writer_settings = audit
    # Connection handlers append from many threads: a group's fdatasync runs on the writer's flusher
    # thread, off the lock they queue on, as in the daemon.
    writer = AuditWriter(
        directory, key_path, source="adl-egress", settings=dataclasses.replace(writer_settings, background_flush=True)
    )
    record = Recorder(writer, agent_of(policy), session)
    resolver = UpstreamResolver(settings.resolver(), settings.dns_timeout_s)
    synthetic = SyntheticAddresses()

    def open_connections() -> tuple[ConnectionFilter, Executor]:
        from concurrent.futures import ThreadPoolExecutor

        from .filter import ConnectionFilter

        # The connection loop runs on one of these threads; what may wait (a name not in the
        # resolver's cache, a WebSocket handshake and its relays) runs on the others, pooled:
        # starting threads per connection would add to the setup latency the filter adds.
        workers = ThreadPoolExecutor(max_workers=2 * settings.max_connections + 8, thread_name_prefix="egress-conn")
        connections = ConnectionFilter(
            policy,
            resolver,
            synthetic,
            record,
            listen_port=netns.FILTER_PORT,
            workers=workers,
            connect_timeout_s=settings.connect_timeout_s,
            sniff_timeout_s=settings.sniff_timeout_ms / 1000,
            message_timeout_s=settings.message_timeout_ms / 1000,
        )
        return connections, workers

    server = FilterServer(record, DnsStub(policy, resolver, synthetic), open_connections, settings.max_connections)
    started = {"upstream_dns": "{}:{}".format(*resolver.server) if resolver.server else None, **started}
    record("net.start", {"decision": "allow", **started})
    writer.sync()  # on disk before the first connection or answer is served
    summary = server.stop(server.serve(control, space))
    writer.close()
    with contextlib.suppress(OSError):
        control.send(json.dumps(summary).encode())


@dataclass
class Recorder:
    """The filter's records in the session's log: each names the agent and carries the session as its
    correlation; denials go ahead of routine records. Past `max_detailed_denials` refusals, further
    ones are only counted (`counted()`, in net.summary); what was allowed is always written."""

    writer: AuditWriter
    agent: str
    session: str
    max_detailed_denials: int = MAX_DETAILED_DENIALS
    _denials: int = 0
    _counted: Tally[str] = field(default_factory=Tally)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _sealed: bool = False
    _writing: int = 0  # records past the seal's check, not written yet
    _written: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._written = threading.Condition(self._lock)

    def seal(self, timeout: float) -> None:
        """The summary comes next: every later record is refused (AuditUnavailable), so what would
        have been recorded after it is denied instead; those already on their way are waited for (up
        to `timeout`), so that they come before it and are in its counts. In a stalled log they wait
        on the writer's lock ahead of the summary."""
        with self._lock:
            self._sealed = True
            self._written.wait_for(lambda: not self._writing, timeout)

    def summarize(self, payload: dict[str, Any]) -> None:
        """The session's net.summary, once sealed."""
        self._write("net.summary", payload, high=payload.get("decision") == "deny")

    def __call__(self, kind: str, payload: dict[str, Any]) -> None:
        # Checked and counted together: a record either comes before the summary or is refused.
        with self._lock:
            if self._sealed:
                raise AuditUnavailable(f"{kind} after the session's net.summary")
            self._writing += 1
        try:
            self._record(kind, payload)
        finally:
            with self._lock:
                self._writing -= 1
                if not self._writing:
                    self._written.notify_all()

    def _record(self, kind: str, payload: dict[str, Any]) -> None:
        high = payload.get("decision") == "deny"
        if high and kind != "net.summary":
            with self._lock:
                self._denials += 1
                over = self._denials - self.max_detailed_denials
                if over > 0:
                    self._counted[str((payload.get("rules") or [kind])[0])] += 1
            if over == 1:
                self._write(
                    "net.denials_counted",
                    {
                        "decision": "deny",
                        "rules": ["net.denials_counted"],
                        "text": f"{self.max_detailed_denials} refusals recorded one by one; later ones are "
                        "counted by rule in this session's net.summary",
                    },
                    high=True,
                )
            if over > 0:
                return
        self._write(kind, payload, high=high)

    def _write(self, kind: str, payload: dict[str, Any], *, high: bool) -> None:
        self.writer.append(
            kind, {"agent": self.agent, **payload}, corr=self.session, priority="high" if high else "normal"
        )

    def counted(self) -> dict[str, Any]:
        """The refusals not written one by one: their number, and how many under each rule."""
        with self._lock:
            return {"total": sum(self._counted.values()), "by_rule": dict(self._counted)}


class FilterServer:
    """What the filter serves once the agent's namespace exists: DNS over UDP and TCP through the stub,
    and TCP connections through the connection filter, on pooled threads, until the launcher says stop."""

    def __init__(
        self,
        record: Recorder,
        stub: DnsStub,
        open_connections: Callable[[], tuple[ConnectionFilter, Executor]],
        max_connections: int,
        *,
        dns_threads: int = 8,
        max_pending: int = MAX_PENDING_QUERIES,
    ) -> None:
        self.record = record
        self.stub = stub
        # The connection filter and its thread pool, made at the first TCP connection (a session
        # that opens none never loads them); only the serving thread makes them.
        self._open_connections = open_connections
        self.connections: ConnectionFilter | None = None
        self.workers: Executor | None = None
        self.max_connections = max_connections
        self.handlers = Counter()
        self.dns_stats = {"queries": 0, "denied": 0, "shed": 0}
        self._dns_lock = threading.Lock()
        self._dns_threads = dns_threads
        self._dns_pool: Executor | None = None  # made at the first UDP query, by the serving thread
        self._pending = threading.BoundedSemaphore(max_pending)
        # TCP connections on the connection loop (see lead): its listeners, the loop and its wake
        # pipe, and the stop, which waits until the loop accepts no more; once stop has its
        # summary, the loop ends whatever is left.
        self._listeners: list[socket.socket] = []
        self._loop: Loop | None = None
        self._wake: tuple[int, int] | None = None
        self._stopping = False
        self._quitting = False
        self._stopped_leading = threading.Event()
        self._loop_ended = threading.Event()  # its connections closed and recorded: stop may sum up
        # What ended the loop unexpectedly (a refusal that could not be recorded): serve() raises
        # it, as it would have raised it accepting on its own thread.
        self._leader_failure: BaseException | None = None
        self._trouble = os.pipe2(os.O_CLOEXEC)  # written once the failure is set; serve() watches it

    def answer(self, wire: bytes) -> bytes | None:
        """The stub's answer to one query, once its record is written; None when it cannot be."""
        outcome = self.stub.answer(wire)
        with self._dns_lock:
            self.dns_stats["queries"] += 1
            self.dns_stats["denied"] += outcome.event.get("decision") == "deny"
        try:
            self.record("net.dns", outcome.event)
        except AuditUnavailable:
            return None  # unrecorded means unanswered
        return outcome.response

    def udp_query(self, sock: socket.socket) -> None:
        """Read one datagram and answer it on a DNS thread; past MAX_PENDING_QUERIES waiting, or with
        no thread to be had, shed it: the client retries, and the count is in net.summary."""
        with contextlib.suppress(OSError):
            wire, peer = sock.recvfrom(65535)
            if self._pending.acquire(blocking=False):
                if self._dns_pool is None:
                    from concurrent.futures import ThreadPoolExecutor

                    self._dns_pool = ThreadPoolExecutor(max_workers=self._dns_threads, thread_name_prefix="egress-dns")
                try:
                    self._dns_pool.submit(self._reply, sock, wire, peer)
                    return
                except RuntimeError:
                    self._pending.release()
            with self._dns_lock:
                self.dns_stats["shed"] += 1

    def _reply(self, sock: socket.socket, wire: bytes, peer: Any) -> None:
        try:
            response = self.answer(wire)
            if response is not None:
                sock.sendto(response, peer)
        finally:
            self._pending.release()

    def tcp_dns(self, conn: socket.socket) -> None:
        """Length-prefixed queries on one connection, answered in turn until it closes."""
        with conn, contextlib.suppress(OSError, struct.error):
            conn.settimeout(10)
            while head := _read_exact(conn, 2):
                wire = _read_exact(conn, struct.unpack("!H", head)[0])
                if wire is None:
                    return
                response = self.answer(wire)
                if response is None:
                    return
                conn.sendall(struct.pack("!H", len(response)) + response)

    def accept(self, listener: socket.socket, kind: str) -> None:
        """One TCP connection (`kind` "tcp": to the connection loop, started now if it is not
        running) or DNS-over-TCP connection (to a pool thread), unless the session already has
        max_connections open: then it is refused, and audited."""
        try:
            conn, _ = listener.accept()
        except OSError as exc:
            if exc.errno in _OUT_OF_RESOURCES:
                time.sleep(ACCEPT_BACKOFF_S)  # the listener stays readable: serve() would spin on it
            return
        with contextlib.suppress(OSError):
            try:
                connections, workers = self._opened()
            except Exception as exc:  # cannot be loaded: refused and audited, and tried again next time
                self._refuse(conn, f"the connection filter could not be loaded: {exc}")
                return
            if kind == "tcp":
                if not self._count_in(conn, connections):
                    return
                why = self._start_loop()
                if why is not None:
                    self.handlers.add(-1)
                    self._refuse(conn, why)
                    return
                assert self._loop is not None
                if not self._loop.post(lambda: self._handle(conn)):
                    self.handlers.add(-1)  # the loop ended meanwhile: refused here, recorded
                    connections.refuse(conn)
                return
            handling = self._admit(conn, connections, workers, lambda: self.tcp_dns(conn))
            if handling is not None:
                handling.add_done_callback(lambda _: self.handlers.add(-1))

    def _admit(
        self, conn: socket.socket, connections: ConnectionFilter, workers: Executor, task: Callable[[], None]
    ) -> Future[None] | None:
        """Count `conn` as handled and give `task` to a pool thread; None once `conn` is refused and
        recorded: the session already has max_connections open, or no thread can be had."""
        if not self._count_in(conn, connections):
            return None
        try:
            return workers.submit(task)
        except RuntimeError as exc:  # no thread to be had (the helpers' pids limit)
            self.handlers.add(-1)
            self._refuse(conn, f"no thread to handle the connection: {exc}")
            return None

    def lead(self, listeners: list[socket.socket]) -> bool:
        """Accept the listeners' connections on the connection loop from now on (serve() stops
        watching them). False: the loop could not be started (no pool thread, or no descriptor for
        its epoll set or wake pipe), and serve() goes on accepting."""
        if self._start_loop() is not None:
            return False
        assert self._loop is not None
        for listener in listeners:
            listener.setblocking(False)  # the loop accepts until there is nothing left to take
        self._listeners = listeners
        self._loop.post(self._watch_listeners)
        return True

    def _start_loop(self) -> str | None:
        """Start the connection loop on a pool thread unless it runs; why it cannot be, else None."""
        if self._loop is not None:
            return None
        connections, workers = self._opened()
        try:
            wake = os.pipe2(os.O_CLOEXEC)
        except OSError as exc:  # out of descriptors (the agent's connections hold them): tried again later
            return f"no descriptor for the connection loop: {exc}"
        try:
            loop = Loop(wake)
        except OSError as exc:
            for end in wake:
                os.close(end)
            return f"no descriptor for the connection loop: {exc}"
        loop.on_wake = self._loop_woken
        connections.attach(loop, self._handled)
        try:
            workers.submit(self._run_loop, loop, connections)
        except RuntimeError as exc:  # no thread to be had (the helpers' pids limit)
            connections.attach(None, self._handled)
            loop.close()
            return f"no thread to handle the connection: {exc}"
        self._loop, self._wake = loop, wake
        return None

    def _handled(self) -> None:
        self.handlers.add(-1)

    def _run_loop(self, loop: Loop, connections: ConnectionFilter) -> None:
        """The connection loop's thread: until stop, and then until its connections are over (or
        stop stops waiting for them). What ends it otherwise (a refusal that could not be recorded)
        ends serve() too."""
        try:
            while not self._quitting and not (self._stopping and not connections.flows and not loop.pending()):
                loop.run_once()
        except BaseException as exc:
            self._leader_failure = exc
            os.write(self._trouble[1], b"x")
            raise
        finally:
            self._stopped_leading.set()
            try:
                connections.abandon()
                # Work posted as the loop ended: a connection accepted then is refused and recorded
                # (taken while closing), a step of one abandoned above does nothing.
                connections.closing = True
                for work in loop.close_posting():
                    with contextlib.suppress(Exception):
                        work()
                connections.abandon()
                loop.close()
            finally:
                self._loop_ended.set()

    def _watch_listeners(self) -> None:
        if self._stopping or self._loop is None:
            return
        for listener in self._listeners:
            self._loop.watch(listener.fileno(), select.EPOLLIN, functools.partial(self._accept_here, listener))

    def _loop_woken(self) -> None:
        if self._stopping and self._loop is not None:  # no connection is accepted from now on
            for listener in self._listeners:
                self._loop.forget(listener.fileno())
            self._stopped_leading.set()

    def _accept_here(self, listener: socket.socket, _events: int = 0) -> None:
        """On the loop: take what the listener has queued, a bounded batch at a time."""
        assert self._loop is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    # The connection stays queued and the listener readable: stop watching it for a
                    # little while instead of spinning on it until a descriptor is free.
                    for sock in self._listeners:
                        self._loop.forget(sock.fileno())
                    self._loop.call_at(time.monotonic() + ACCEPT_BACKOFF_S, self._watch_listeners)
                    return
                continue  # gone before it was accepted
            self._take(conn)

    def _take(self, conn: socket.socket) -> None:
        """On the loop: a connection to handle, or to refuse past max_connections (a refusal that
        cannot be recorded ends the loop, and serve() with it)."""
        assert self.connections is not None
        if self._count_in(conn, self.connections):
            self._handle(conn)

    def _count_in(self, conn: socket.socket, connections: ConnectionFilter) -> bool:
        """Count `conn` as handled; False once it is refused and recorded: the session already has
        max_connections open."""
        if self.handlers.value >= self.max_connections:
            connections.refuse_over_limit(conn, self.max_connections)
            return False
        self.handlers.add(1)
        return True

    def _handle(self, conn: socket.socket) -> None:
        assert self.connections is not None
        self.connections.handle(conn)  # looked up now: the filter's own, or what replaced it

    def _stop_leading(self, timeout: float = 5.0) -> None:
        """No TCP connection is accepted once this returns (else `timeout` passed)."""
        if self._loop is None:
            return
        self._stopping = True
        self._loop.poke()
        self._stopped_leading.wait(timeout)

    def _refuse(self, conn: socket.socket, why: str) -> None:
        """Reset a connection nothing can handle, and record it (the filter itself keeps serving)."""
        with contextlib.suppress(OSError):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # a reset
        conn.close()
        self.record("net.connect", one_rule("deny", "net.filter_error", why))

    def _opened(self) -> tuple[ConnectionFilter, Executor]:
        if self.connections is None or self.workers is None:
            self.connections, self.workers = self._open_connections()
        return self.connections, self.workers

    def serve(self, control: socket.socket, space: netns.AgentNamespace) -> dict[str, Any]:
        """Serve until the launcher sends "stop"; return the namespace's drop counters it sends along
        (this process has no capabilities left to read them)."""
        selector = selectors.DefaultSelector()
        selector.register(control, selectors.EVENT_READ, "control")
        selector.register(self._trouble[0], selectors.EVENT_READ, "trouble")
        for kind, listeners in (("tcp", space.tcp), ("dns_tcp", space.dns_tcp), ("dns_udp", space.dns_udp)):
            for listener in listeners:
                selector.register(listener, selectors.EVENT_READ, kind)
        dropped: dict[str, Any] = {"error": "the launcher sent no drop counters"}
        running = True
        with selector:
            while running:
                for key, _ in selector.select():
                    sock: socket.socket = key.fileobj  # type: ignore[assignment]
                    if key.data == "trouble" and self._leader_failure is not None:
                        raise self._leader_failure
                    if key.data == "control":
                        # Reading "stop" also keeps the reply to it from a reset.
                        with contextlib.suppress(OSError, ValueError):
                            dropped = json.loads(control.recv(65536).removeprefix(b"stop "))
                        running = False
                    elif key.data == "dns_udp":
                        self.udp_query(sock)
                    elif key.data == "tcp" and self._wake is not None:
                        continue  # handed to the pool earlier in this batch: its accepting thread takes it
                    elif key.data in ("tcp", "dns_tcp"):
                        self.accept(sock, key.data)
                        if key.data == "tcp" and self.connections is not None and self.lead(space.tcp):
                            for listener in space.tcp:
                                selector.unregister(listener)
        return dropped

    def stop(self, dropped: dict[str, Any], wait_s: float = STOP_WAIT_S) -> dict[str, Any]:
        """Cut open connections, wait briefly (`wait_s`, a few times) for their handlers, and record
        the session's summary. Every connection is recorded before it: those still on a pool thread
        then are recorded here in its place; one that cannot be (a record of its own is stuck in
        the log) is counted in the summary (`unfinished_connections`). Nothing is recorded after it."""
        self._stop_leading(wait_s)
        if self.connections is not None:
            self.connections.shutdown_all()
        self.handlers.wait_zero(timeout=wait_s)
        unfinished = 0
        if self.connections is not None:
            unfinished += self.connections.end_handed(timeout=wait_s)
        if self._loop is not None:
            self._quitting = True
            self._loop.poke()
            # what it ends is recorded and counted before the summary
            if not self._loop_ended.wait(timeout=wait_s) and self.connections is not None:
                unfinished += len(self.connections.flows)
        if self.workers is not None:
            self.workers.shutdown(wait=False, cancel_futures=True)
        if self._dns_pool is not None:
            self._dns_pool.shutdown(wait=True, cancel_futures=True)
        self.record.seal(timeout=wait_s)  # what is on its way is written, and counted, before the summary
        with self._dns_lock:
            dns_stats = dict(self.dns_stats)
        summary = {
            "connections": dict(self.connections.stats) if self.connections is not None else dict(NO_CONNECTIONS),
            # whose records were still being written when the stop stopped waiting (a stalled log):
            # written before this summary, if at all
            "unfinished_connections": unfinished,
            "dns": dns_stats,
            "dropped_packets": dropped,
            "denials_counted_only": self.record.counted(),
        }
        rules = sorted(f"net.{name}" for name, count in dropped.items() if isinstance(count, int) and count)
        self.record.summarize({"decision": "deny" if rules else "allow", "rules": rules, **summary})
        return summary


class Counter:
    """Open connection handlers: bounded by max_connections, waited for at stop."""

    def __init__(self) -> None:
        self.value = 0
        self._changed = threading.Condition()

    def add(self, delta: int) -> None:
        with self._changed:
            self.value += delta
            self._changed.notify_all()

    def wait_zero(self, timeout: float) -> None:
        with self._changed:
            self._changed.wait_for(lambda: self.value <= 0, timeout=timeout)


def _read_exact(conn: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = conn.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data
