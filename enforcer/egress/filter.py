"""The connection filter: every TCP connection the agent opens arrives here (nftables redirect).

For each one it works out the host the agent meant (the name behind the synthetic address the DNS
stub gave, else the literal address), reads the client's first message whole (a ClientHello or an
HTTP request head, however segmented, within size and time bounds, else refused) and refuses a name
in it that is not that host (domain fronting), or a missing one where a name was meant; resolves the
name itself, checks every candidate address with the policy (host, port, observed protocol,
deny_private, residency), dials exactly the address it checked, and relays. A plain-HTTP
connection is relayed head by head, each one checked. Each decision is audited before a byte moves;
each connection's totals when it ends.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import itertools
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ..audit.events import one_rule
from ..policy import Decision, NetworkConnect, Policy, decide
from ..policy.patterns import PatternError, normalize_host
from .dns import IPAddress, ResolveError, SyntheticAddresses, UpstreamResolver, host_allowed
from .loop import Loop, Timer
from .relay import Relay, Way, end_both, relay, run_relay
from .sniff import (
    MAX_HTTP_HEAD,
    Malformed,
    RequestHead,
    Sniffed,
    claimed_hosts,
    fields,
    head_end,
    is_websocket,
    parse_head,
    protocol_name,
    sniff,
)
from .stream import (
    ClientGone,
    ClientReader,
    Outbound,
    forward_body,
    may_change,
    read_head,
)

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same value
_OPAQUE_LABELS = frozenset({"ssh"})  # what the filter names from a banner but cannot read past
Record = Callable[[str, dict[str, Any]], None]  # (kind, payload); raises when it cannot be written
# decide() answers kept per filter; the agent chooses the questions (hosts, ports, addresses), so
# the memory is bounded: past this many, it starts again empty.
MAX_KEPT_DECISIONS = 4096
FAREWELL_S = 1.0  # a refused HTTP client's time to read its 403 and close


@dataclass
class Verdict:
    decision: str  # allow | deny
    rule: str
    text: str
    address: IPAddress | None = None
    pointer: str = ""


_STOPPED = Verdict("deny", "net.filter_error", "the filter stopped before the connection was decided")


def original_destination(sock: socket.socket) -> tuple[IPAddress, int]:
    """Where the agent tried to connect before nftables redirected it here."""
    if sock.family == socket.AF_INET6:
        raw = sock.getsockopt(socket.IPPROTO_IPV6, SO_ORIGINAL_DST, 28)
        return ipaddress.IPv6Address(raw[8:24]), struct.unpack_from("!H", raw, 2)[0]
    raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
    return ipaddress.IPv4Address(raw[4:8]), struct.unpack_from("!H", raw, 2)[0]


_NO_TIME_LIMIT = struct.pack("ll", 0, 0)  # struct timeval


def dial(address: IPAddress, port: int, timeout_s: float) -> socket.socket:
    """A blocking TCP connection to exactly `address`, given up after `timeout_s`: the limit is
    SO_SNDTIMEO, which a blocking connect(2) honours (one call, where a Python timeout makes it
    non-blocking connect, poll and SO_ERROR, and two switches of mode). Its sends keep that limit
    until blocking_sends() lifts it."""
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        seconds = int(timeout_s)
        micros = max(int((timeout_s - seconds) * 1e6), 0 if seconds else 1)  # all zero: no limit at all
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros))
        try:
            sock.connect((str(address), port))
        except BlockingIOError:  # EINPROGRESS from a blocking connect: the limit passed
            raise TimeoutError(f"no connection within {timeout_s:g} s") from None
    except BaseException:
        sock.close()
        raise
    return sock


def blocking_sends(sock: socket.socket) -> None:
    """Sends on a dialled socket wait as long as the peer takes to read, as the agent's do."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _NO_TIME_LIMIT)


def reset(sock: socket.socket) -> None:
    """Close with RST so the agent sees 'connection reset' at once, not a hang."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Flow:
    """One connection's state while the loop steps it (and, once handed over, its pool thread)."""

    __slots__ = (
        "again",
        "back",
        "client",
        "conn_id",
        "done",
        "event",
        "farewell",
        "host",
        "late",
        "lock",
        "moved",
        "name",
        "out",
        "patient",
        "port",
        "reader",
        "recorded",
        "refused",
        "relay",
        "requests",
        "sniffed",
        "started",
        "taken",
        "target",
        "timer",
        "upstream",
        "verdict",
        "watching",
    )

    def __init__(self, client: socket.socket, conn_id: int, started: float) -> None:
        self.client = client
        self.conn_id = conn_id
        self.started = started
        self.reader = ClientReader(client)
        self.event: dict[str, Any] = {}
        self.target: IPAddress | None = None
        self.port = 0
        self.host = ""
        self.name: str | None = None
        self.sniffed: Sniffed | None = None  # while sniffing: what the bytes so far say
        self.timer: Timer | None = None
        self.watching: dict[int, tuple[int, Callable[..., None]]] = {}  # descriptor -> events, step
        self.upstream: socket.socket | None = None
        self.verdict: Verdict | None = None
        self.relay: Relay | None = None
        # Plain HTTP: the agent's requests moved one by one, the way back spliced, and what was
        # refused after the connection was allowed.
        self.out: Outbound | None = None
        self.back: Way | None = None
        self.refused: list[Verdict] = []
        self.farewell = b""  # a refused HTTP client's 403, not yet written
        self.again = False  # a step of its requests is due at once (its share of the last one was spent)
        # A client that waited for the server: given message_timeout_s more to speak first where tcp
        # would be refused (patient), and once relayed, its first message as read so far (late).
        self.patient = False
        self.late: Sniffed | None = None
        self.recorded = False  # its net.connect is written
        self.done = False
        # On a pool thread: its records are written under `lock`; `taken` once its last one is (by
        # the thread, or by the stop in its place); bytes each way and requests as they move.
        self.lock: threading.RLock | None = None
        self.taken = False
        self.moved = [0, 0]
        self.requests = [0]


class _TakenOver(Exception):
    """The stop recorded a pool thread's connection in its place: the thread records nothing more."""


class ConnectionFilter:
    def __init__(
        self,
        policy: Policy,
        resolver: UpstreamResolver,
        synthetic: SyntheticAddresses,
        record: Record,
        *,
        listen_port: int,
        workers: Executor,
        connect_timeout_s: float,
        sniff_timeout_s: float,
        message_timeout_s: float = 5.0,
    ) -> None:
        self.policy = policy
        self.resolver = resolver
        self.synthetic = synthetic
        self.record = record
        self.listen_port = listen_port
        self.workers = workers
        self.connect_timeout_s = connect_timeout_s
        self.sniff_timeout_s = sniff_timeout_s
        self.message_timeout_s = message_timeout_s
        self.switch_timeout_s = 30.0  # a WebSocket handshake's answer
        self._ids = itertools.count(1)
        # decide() is a pure function of the policy (fixed for the filter's life) and the question.
        self._decisions: dict[NetworkConnect, Decision] = {}
        self._lock = threading.Lock()
        self.active: set[socket.socket] = set()
        # The loop that steps connections (attach()), what handle() tells when one is over, and how
        # connections the loop holds (read and written on its thread only).
        self.loop: Loop | None = None
        self.ended: Callable[[], None] = _nothing
        self.flows: set[_Flow] = set()
        self.handed: set[_Flow] = set()  # on pool threads (under _lock)
        self.closing = False  # stopping: a connection taken from now on is refused
        self.stats = {"connections": 0, "allowed": 0, "denied": 0, "bytes_out": 0, "bytes_in": 0}

    # -- per connection, on the loop

    def attach(self, loop: Loop | None, ended: Callable[[], None]) -> None:
        """Handle connections on `loop` from now on; `ended` is called once for each connection
        handle() took, when it is over (on whichever thread ends it)."""
        self.loop = loop
        self.ended = ended

    def handle(self, client: socket.socket) -> None:
        """Take a new connection, on the loop's thread. Its original destination (or its CONNECT,
        through the filter as a proxy), its first message and the decision on it, the dial and the
        relay (spliced, or plain HTTP head by head) are stepped by the loop as its sockets become
        ready; a WebSocket handshake continues on a pool thread once the loop has read it. Nothing
        here waits: a slow or silent peer holds only its own connection."""
        assert self.loop is not None, "handle() runs on the connection loop"
        flow = _Flow(client, next(self._ids), time.monotonic())
        with self._lock:
            self.stats["connections"] += 1
            self.active.add(client)
        self.flows.add(flow)
        if self.closing:
            # Accepted before the stop, taken after it: refused before anything of it moves.
            flow.event = {"connection": flow.conn_id}
            self._step(flow, self._refuse_here, _STOPPED)
            return
        self._step(flow, self._begin)

    def _step(self, flow: _Flow, step: Callable[..., None], *args: Any) -> None:
        """Run one step of a connection on the loop: an exception (a bug, an I/O error, a record
        that cannot be written) refuses the connection, and that is audited, as on a pool thread."""
        if flow.done:
            return
        try:
            step(flow, *args)
        except Exception as exc:
            self._fail(flow, f"{type(exc).__name__}: {exc}")

    def _fail(self, flow: _Flow, why: str) -> None:
        if flow.done:
            return  # ended (and recorded) before what failed: not refused a second time
        reset(flow.client)
        if not flow.recorded:  # counted as every refusal is (one recorded allowed stays counted so)
            with self._lock:
                self.stats["denied"] += 1
        with contextlib.suppress(Exception):
            event = {**flow.event, "connection": flow.conn_id}
            self.record("net.connect", {**event, **one_rule("deny", "net.filter_error", why)})
        if self._relaying(flow):  # bytes already moved: they are counted and closed as any relay's
            with contextlib.suppress(Exception):
                self._record_relayed(flow)
        self._end(flow)

    def _watch(self, flow: _Flow, fd: int, mask: int, step: Callable[..., None], *args: Any) -> None:
        assert self.loop is not None
        if flow.watching.get(fd) == (mask, step):
            return  # the same wait for the same step (its arguments follow from the descriptor)
        flow.watching[fd] = (mask, step)
        self.loop.watch(fd, mask, lambda _events: self._step(flow, step, *args))

    def _watch_only(self, flow: _Flow, wanted: dict[int, int], step: Callable[..., None]) -> None:
        """Wait on exactly `wanted` (descriptor: events) for `step`, called with the ready descriptor."""
        for fd in [fd for fd in flow.watching if fd not in wanted]:
            self._forget(flow, fd)
        for fd, mask in wanted.items():
            self._watch(flow, fd, mask, step, {fd})

    def _forget(self, flow: _Flow, fd: int) -> None:
        assert self.loop is not None
        if flow.watching.pop(fd, None) is not None:
            self.loop.forget(fd)

    def _set_timer(self, flow: _Flow, delay_s: float, step: Callable[..., None], *args: Any) -> None:
        assert self.loop is not None
        self.loop.cancel(flow.timer)
        flow.timer = self.loop.call_at(time.monotonic() + delay_s, lambda: self._step(flow, step, *args))

    def _begin(self, flow: _Flow) -> None:
        client = flow.client
        try:
            target, port = original_destination(client)
        except OSError:
            target, port = None, 0
        flow.event = {"connection": flow.conn_id, "port": port, "destination": str(target)}
        if target is None:
            self._refuse_here(flow, Verdict("deny", "net.not_captured", "no original destination"))
            return
        flow.target, flow.port = target, port
        client.setblocking(False)
        with contextlib.suppress(OSError):  # a response's head and body are separate writes
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if target.is_loopback and port == self.listen_port:
            # The agent asked for us as its HTTPS proxy: its CONNECT head first, within message_timeout_s
            # for its first byte and again from it.
            flow.event["via"] = "connect"
            self._set_timer(flow, self.message_timeout_s, self._proxy_expired)
            self._watch(flow, client.fileno(), select.EPOLLIN, self._proxy_more)
            self._proxy_more(flow)
            return
        flow.name = self.synthetic.name_for(target)  # None: a literal address
        flow.host = flow.name or str(target)
        flow.event["host"] = flow.host
        self._start_sniff(flow)

    def _start_sniff(self, flow: _Flow) -> None:
        # Until the first byte: silent after sniff_timeout_s; from it, the message within message_timeout_s.
        self._set_timer(flow, self.sniff_timeout_s, self._sniff_expired)
        self._watch(flow, flow.client.fileno(), select.EPOLLIN, self._sniff_more)
        if flow.reader.buffer:  # sent right behind the proxy request
            self._sniff_read(flow, 0)
        else:
            self._sniff_more(flow)  # what has arrived already is read without waiting for the loop

    def _proxy_more(self, flow: _Flow) -> None:
        reader = flow.reader
        before = len(reader.buffer)
        try:
            if not reader.read_ready():
                return
        except ClientGone:
            if reader.buffer.strip(b"\r\n"):
                self._proxy_answered(flow, Malformed("client went away mid-head"))
            else:
                self._proxy_answered(flow, None)
            return
        if not before:
            self._set_timer(flow, self.message_timeout_s, self._proxy_expired)
        if b"\n" in reader.buffer[before:] or len(reader.buffer) > MAX_HTTP_HEAD:
            try:
                head = parse_head(bytes(reader.buffer[: MAX_HTTP_HEAD + 1]))
            except Malformed as exc:
                self._proxy_answered(flow, exc)
                return
            if head is not None:
                self._proxy_answered(flow, head)

    def _proxy_expired(self, flow: _Flow) -> None:
        s = self.message_timeout_s
        if flow.reader.buffer:
            self._proxy_answered(flow, Malformed(f"incomplete HTTP request head after {s:g} s"))
        else:
            self._proxy_answered(flow, Malformed(f"no HTTP request head within {s:g} s"))

    def _proxy_answered(self, flow: _Flow, head: RequestHead | Malformed | None) -> None:
        """The proxy request is read (or will not be): refused with a 403, or tunnelled: what
        follows it is sniffed and decided as a captured connection's first message."""
        assert self.loop is not None
        self.loop.cancel(flow.timer)
        flow.timer = None
        self._forget(flow, flow.client.fileno())
        if isinstance(head, Malformed):
            verdict = Verdict("deny", "net.proxy_request", f"unreadable proxy request: {head}")
            self._refuse_here(flow, verdict, http=True)
            return
        if head is not None:
            flow.reader.take(head.size)
        tunnel = self._proxy_target(head, flow.event)
        if isinstance(tunnel, Verdict):
            self._refuse_here(flow, tunnel, http=True)
            return
        flow.host, flow.name, flow.port, flow.target = tunnel
        flow.event["host"] = flow.host
        established = b"HTTP/1.1 200 Connection Established\r\n\r\n"
        with contextlib.suppress(OSError):  # a fresh socket's buffer takes it whole, or the client is gone
            flow.client.send(established)
        self._start_sniff(flow)

    def _sniff_more(self, flow: _Flow) -> None:
        """Read what the agent sent so far and sniff it, without waiting: the first-byte and message
        deadlines are on the loop's timers."""
        before = len(flow.reader.buffer)
        try:
            if not flow.reader.read_ready():
                return
        except ClientGone as exc:
            self._sniffed(flow, _gone(flow.sniffed, str(exc)))
            return
        self._sniff_read(flow, before)

    def _sniff_read(self, flow: _Flow, before: int) -> None:
        """Sniff the buffer again once what was read past `before` can change the answer."""
        reader = flow.reader
        if flow.sniffed is None:
            self._set_timer(flow, self.message_timeout_s, self._sniff_expired)
            flow.sniffed = sniff(bytes(reader.buffer))
        elif may_change(flow.sniffed, reader.buffer, before):
            flow.sniffed = sniff(bytes(reader.buffer))
        if flow.sniffed.complete or flow.sniffed.malformed:
            self._sniffed(flow, flow.sniffed)

    def _sniff_expired(self, flow: _Flow) -> None:
        if flow.sniffed is None:
            self._sniffed(flow, Sniffed("tcp", silent=True))
            return
        self._sniffed(flow, _overdue(flow.sniffed, self.message_timeout_s, len(flow.reader.buffer)))

    def _sniffed(self, flow: _Flow, sniffed: Sniffed) -> None:
        """The first message is read (or will not be, a silent client): decided here, but for a
        WebSocket handshake, which goes on on a pool thread."""
        assert self.loop is not None and flow.target is not None
        if sniffed.silent and not flow.patient and self._opaque_refused(flow.host, flow.port):
            # tcp would be refused anyway: give a slow client time to say what it speaks
            flow.patient = True
            self._set_timer(flow, self.message_timeout_s, self._sniff_expired)
            return
        self.loop.cancel(flow.timer)
        flow.timer = None
        flow.sniffed = sniffed
        if sniffed.head is not None and is_websocket(sniffed.head):
            self._hand_over(flow)  # the server's answer to the switch may come much later
            return
        self._forget(flow, flow.client.fileno())  # what it sends next waits in the kernel until relayed
        protocol = protocol_name(sniffed, flow.port)
        flow.event["protocol"] = protocol
        _record_names(flow.event, sniffed)
        candidates: list[IPAddress] | None = [flow.target]
        if flow.name is not None and _name_problem(sniffed, flow.host, flow.name) is None:
            candidates = self.resolver.cached_addresses(flow.name)
        if candidates is None:
            # Resolving may wait for the upstream resolver: done on a pool thread.
            host, name, port, target = flow.host, flow.name, flow.port, flow.target
            self._off_loop(flow, lambda: self._verdict(host, name, port, protocol, sniffed, target), self._decided)
            return
        self._decided(flow, self._verdict(flow.host, flow.name, flow.port, protocol, sniffed, flow.target, candidates))

    def _off_loop(self, flow: _Flow, work: Callable[[], Any], then: Callable[[_Flow, Any], None]) -> None:
        """Run `work` on a pool thread and `then(flow, its result)` back on the loop."""
        loop = self.loop
        assert loop is not None

        def run() -> None:
            try:
                result = work()
            except Exception as exc:
                failure = f"{type(exc).__name__}: {exc}"
                loop.post(lambda: self._step(flow, self._fail, failure))
                return
            loop.post(lambda: self._step(flow, then, result))

        try:
            self.workers.submit(run)
        except RuntimeError as exc:  # no thread to be had (the helpers' pids limit)
            self._fail(flow, f"no thread to handle the connection: {exc}")

    def _decided(self, flow: _Flow, verdict: Verdict) -> None:
        assert self.loop is not None
        if verdict.address is not None:
            flow.event["address"] = str(verdict.address)
        if verdict.decision == "deny":
            self._refuse_here(flow, verdict)
            return
        assert verdict.address is not None
        flow.verdict = verdict
        family = socket.AF_INET6 if verdict.address.version == 6 else socket.AF_INET
        try:
            upstream = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        except OSError as exc:
            self._dial_failed(flow, exc)
            return
        flow.upstream = upstream
        # Exactly the address that was checked; the handshake starts only now, after the decision.
        error = upstream.connect_ex((str(verdict.address), flow.port))
        if error == 0:
            self._dialled(flow)
        elif error != errno.EINPROGRESS:
            self._dial_failed(flow, OSError(error, os.strerror(error)))
        else:
            late = TimeoutError(f"no connection within {self.connect_timeout_s:g} s")
            self._set_timer(flow, self.connect_timeout_s, self._dial_failed, late)
            self._watch(flow, upstream.fileno(), select.EPOLLOUT, self._dial_ready)

    def _dial_ready(self, flow: _Flow) -> None:
        assert flow.upstream is not None
        error = flow.upstream.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            self._dial_failed(flow, OSError(error, os.strerror(error)))
            return
        try:
            flow.upstream.getpeername()
        except OSError:
            return  # not connected yet: a wake meant for a descriptor closed in the same round
        self._dialled(flow)

    def _dial_failed(self, flow: _Flow, exc: BaseException) -> None:
        assert flow.verdict is not None or flow.upstream is None
        address = flow.verdict.address if flow.verdict is not None else None
        if flow.upstream is not None:
            self._forget(flow, flow.upstream.fileno())
            flow.upstream.close()
            flow.upstream = None
        self._refuse_here(flow, Verdict("deny", "net.dial_failed", f"{address} port {flow.port}: {exc}"))

    def _dialled(self, flow: _Flow) -> None:
        assert self.loop is not None and flow.upstream is not None and flow.verdict is not None
        upstream = flow.upstream
        self.loop.cancel(flow.timer)
        flow.timer = None
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        flow.event["setup_us"] = round((time.monotonic() - flow.started) * 1e6)
        if not self._cut_at_stop(upstream):  # the stop came during the dial: nothing of it moves
            self._forget(flow, upstream.fileno())
            upstream.close()
            flow.upstream = None
            self._refuse_here(flow, _STOPPED)
            return
        # What relays it (its pipes) is made before the connection is recorded as allowed: without
        # a descriptor for them it is refused, never allowed and then refused.
        try:
            start = self._movers(flow, upstream)
        except OSError as exc:
            with self._lock:
                self.active.discard(upstream)
            self._dial_failed(flow, exc)
            return
        self._emit("net.connect", flow.event, flow.verdict)  # audited before a byte moves
        flow.recorded = True
        with self._lock:
            self.stats["allowed"] += 1
        start(flow, None)

    def _movers(self, flow: _Flow, upstream: socket.socket) -> Callable[[_Flow, set[int] | None], None]:
        """Make what relays a dialled connection; returns the step that starts it."""
        if flow.sniffed is not None and flow.sniffed.silent:
            # It waits for the server: the way back is relayed while its first message, whenever it
            # comes, is read whole and checked before anything of it goes upstream.
            flow.back = Way(upstream, flow.client)
            return self._late_step
        head = flow.sniffed.head if flow.sniffed is not None else None
        if head is not None:
            # Plain HTTP: each request head read, checked and forwarded; the answers spliced back.
            host, name = flow.host, flow.name
            flow.back = Way(upstream, flow.client)
            flow.reader.take(head.size)
            flow.out = Outbound(
                flow.reader,
                upstream,
                head,
                lambda following: _request_problem(following, host, name, first=False),
                self.message_timeout_s,
            )
            return self._http_step
        # The ClientHello, or opaque bytes, checked whole: every later byte is spliced, both ways.
        flow.relay = Relay(flow.client, upstream, bytes(flow.reader.buffer))
        flow.reader.take(len(flow.reader.buffer))
        return self._relay_step

    def _http_step(self, flow: _Flow, ready: set[int] | None) -> None:
        """Step a plain-HTTP connection: the way back where its socket is ready, the agent's
        requests where theirs is (None: both, the first time)."""
        out, back, loop = flow.out, flow.back, self.loop
        assert out is not None and back is not None and flow.upstream is not None and loop is not None
        moving = not out.done
        cut = False
        try:
            want = back.wants()
            if want is not None and (ready is None or want[0] in ready):
                back.step()
            want = out.wants()
            if want is not None and (ready is None or want[0] in ready):
                out.step()
        except OSError:
            end_both(flow.client, flow.upstream)  # one side reset
            out.state = "done"
            cut = True
        if out.refusal is not None and not flow.refused:
            named, problem = out.refusal
            verdict = problem if isinstance(problem, Verdict) else Verdict("deny", "net.unreadable", str(problem))
            self._refuse_later(flow.reader, flow.upstream, flow.event, named, verdict, flow.refused, out.requests + 1)
        if cut:
            # Both sides are cut: what either way still holds can no longer be written, and its
            # socket would go on polling ready for it.
            self._http_closed(flow)
            return
        if moving and out.done:
            with contextlib.suppress(OSError):
                flow.upstream.shutdown(socket.SHUT_WR)  # the agent's requests are over
        deadline = None if out.done else out.deadline
        if deadline is None or flow.timer is None or flow.timer.when != deadline:
            loop.cancel(flow.timer)
            flow.timer = None
            if deadline is not None:
                flow.timer = loop.call_at(deadline, lambda: self._step(flow, self._http_expired))
        wanted: dict[int, int] = {}
        for way_wants in (out.wants(), back.wants()):
            if way_wants is not None:
                wanted[way_wants[0]] = wanted.get(way_wants[0], 0) | way_wants[1]
        if not wanted:
            self._http_closed(flow)
            return
        self._watch_only(flow, wanted, self._http_step)
        if out.more and not flow.again:
            # What is left may be read already: no readiness would bring the loop back for it.
            flow.again = True
            loop.call_at(time.monotonic(), lambda: self._step(flow, self._http_again))

    def _http_again(self, flow: _Flow) -> None:
        assert flow.out is not None
        flow.again = False
        want = flow.out.wants()
        self._http_step(flow, {want[0]} if want is not None else set())

    def _late_step(self, flow: _Flow, ready: set[int] | None, overdue: Sniffed | None = None) -> None:
        """A silent client's connection before its first message is through: the way back stepped,
        the agent's bytes read and sniffed (from its first byte, within message_timeout_s); then
        checked like a first message (no switch followed) and relayed as what it turned out to be.
        `overdue`: the message's deadline passed, it is decided as it stands."""
        back, upstream, client, loop = flow.back, flow.upstream, flow.client, self.loop
        assert back is not None and upstream is not None and loop is not None
        reading = flow.late is None or not (flow.late.complete or flow.late.malformed)
        if overdue is not None:
            flow.late = overdue  # after `reading`: still to be decided, below
        try:
            want = back.wants()
            if want is not None and (ready is None or want[0] in ready):
                back.step()
        except OSError:
            end_both(client, upstream)  # one side reset: nothing more can move, either way
            self._http_closed(flow)
            return
        if reading and (ready is None or client.fileno() in ready):
            self._late_read(flow)
        late = flow.late
        if late is not None and (late.complete or late.malformed) and not flow.refused and reading:
            loop.cancel(flow.timer)
            flow.timer = None
            if late.malformed and not flow.reader.buffer:
                with contextlib.suppress(OSError):
                    upstream.shutdown(socket.SHUT_WR)  # it left without sending anything
            else:
                problem = _name_problem(late, flow.host, flow.name, first=False)  # no switch is followed here
                if problem is not None:
                    self._refuse_later(flow.reader, upstream, flow.event, late, problem, flow.refused, 1)
                elif late.head is not None:
                    flow.reader.take(late.head.size)
                    host, name = flow.host, flow.name
                    flow.out = Outbound(
                        flow.reader,
                        upstream,
                        late.head,
                        lambda following: _request_problem(following, host, name, first=False),
                        self.message_timeout_s,
                    )
                    self._http_step(flow, None)
                    return
                else:
                    flow.relay = Relay(client, upstream, flow.reader.take(len(flow.reader.buffer)), back)
                    flow.back = None
                    self._relay_step(flow, None)
                    return
        wanted = back.wants()
        watching: dict[int, int] = {wanted[0]: wanted[1]} if wanted is not None else {}
        late = flow.late
        if not flow.refused and (late is None or not (late.complete or late.malformed)):
            watching[client.fileno()] = watching.get(client.fileno(), 0) | select.EPOLLIN
        if not watching:
            self._http_closed(flow)
            return
        self._watch_only(flow, watching, self._late_step)

    def _late_read(self, flow: _Flow) -> None:
        reader = flow.reader
        before = len(reader.buffer)
        try:
            if not reader.read_ready():
                return
        except ClientGone as exc:
            flow.late = _gone(flow.late, str(exc))
            return
        if flow.late is None:
            self._set_timer(flow, self.message_timeout_s, self._late_expired)
            flow.late = sniff(bytes(reader.buffer))
        elif may_change(flow.late, reader.buffer, before):
            flow.late = sniff(bytes(reader.buffer))

    def _late_expired(self, flow: _Flow) -> None:
        assert flow.late is not None
        flow.timer = None
        self._late_step(flow, set(), _overdue(flow.late, self.message_timeout_s, len(flow.reader.buffer)))

    def _http_expired(self, flow: _Flow) -> None:
        assert flow.out is not None
        flow.timer = None
        flow.out.expired()
        self._http_step(flow, set())

    def _http_closed(self, flow: _Flow) -> None:
        """A plain-HTTP connection, or a silent one that never got through its first message, is over."""
        assert flow.back is not None and flow.verdict is not None
        if flow.refused:
            reset(flow.client)  # earlier responses may still be in flight: no answer can follow them
        self._record_relayed(flow)
        self._end(flow)

    def _relay_step(self, flow: _Flow, ready: set[int] | None) -> None:
        assert flow.relay is not None
        try:
            flow.relay.step(ready)
        except OSError:
            self._relayed(flow)  # one side reset: both are ended
            return
        wanted = flow.relay.wanted()
        if not wanted:
            self._relayed(flow)
            return
        self._watch_only(flow, wanted, self._relay_step)

    def _relayed(self, flow: _Flow) -> None:
        assert flow.relay is not None
        self._record_relayed(flow)
        self._end(flow)

    def _record_close(
        self,
        conn_id: int,
        host: str | None,
        port: int,
        verdict: Verdict,
        sent: int,
        received: int,
        started: float,
        requests: int = 0,
        *,
        flow: _Flow | None = None,
    ) -> None:
        """A connection's `net.close`, its bytes added to the counters."""
        closing: dict[str, Any] = {
            "connection": conn_id,
            "host": host,
            "port": port,
            "address": str(verdict.address),
            "bytes_out": sent,
            "bytes_in": received,
            "duration_ms": round((time.monotonic() - started) * 1000, 3),
        }
        if requests:
            closing["requests"] = requests
        with self._owning(flow):  # counted and written together, or neither (the stop took it over)
            with self._lock:
                self.stats["bytes_out"] += sent
                self.stats["bytes_in"] += received
            self._write("net.close", closing, flow=flow, final=True)

    def _refuse_here(self, flow: _Flow, verdict: Verdict, *, http: bool | None = None) -> None:
        """Refused on the loop: audited, then a plain-HTTP client (or one that asked us as its proxy)
        gets a readable answer, anything else a reset."""
        if http is None:
            http = flow.sniffed is not None and flow.sniffed.protocol == "http"
        if not http:
            self._deny(flow.client, flow.event, verdict)
            self._end(flow)
            return
        with self._lock:
            self.stats["denied"] += 1
        self._emit("net.connect", flow.event, verdict)
        flow.recorded = True
        flow.farewell = _refusal_answer(verdict)
        with contextlib.suppress(OSError):
            flow.client.recv(65536)  # consume the request: closing over unread bytes resets
        self._forget(flow, flow.client.fileno())
        self._set_timer(flow, FAREWELL_S, self._end)  # whatever the client does, it is closed then
        self._farewell(flow)

    def _farewell(self, flow: _Flow) -> None:
        """Write the 403, end our side, and read until the client closes (or the timer ends it)."""
        client = flow.client
        try:
            while flow.farewell:
                flow.farewell = flow.farewell[client.send(flow.farewell) :]
                if not flow.farewell:
                    client.shutdown(socket.SHUT_WR)
            for _ in range(16):  # then back to the loop: a client that keeps sending holds no more
                if not client.recv(65536):
                    self._end(flow)
                    return
        except BlockingIOError:
            pass
        except OSError:
            self._end(flow)
            return
        self._watch(flow, client.fileno(), select.EPOLLOUT if flow.farewell else select.EPOLLIN, self._farewell)

    def _end(self, flow: _Flow) -> None:
        """The connection is over on the loop: stop watching, close, count it out. Once only."""
        if flow.done:
            return
        flow.done = True
        assert self.loop is not None
        self.loop.cancel(flow.timer)
        for fd in list(flow.watching):
            self._forget(flow, fd)
        try:
            self._close(flow)
        finally:
            self.flows.discard(flow)
            self.ended()

    def _close(self, flow: _Flow) -> None:
        """Close the connection's sockets and what moved its bytes; the stop no longer cuts them."""
        with self._lock:
            self.active.discard(flow.client)
            if flow.upstream is not None:
                self.active.discard(flow.upstream)
        try:
            for moving in (flow.relay, flow.out, flow.back):
                if moving is not None:
                    moving.close()
        finally:
            for sock in (flow.client, flow.upstream):
                if sock is not None:
                    sock.close()

    def _hand_over(self, flow: _Flow) -> None:
        """Continue the connection on a pool thread, blocking, from where the loop left it."""
        assert self.loop is not None
        self.loop.cancel(flow.timer)
        flow.timer = None
        self._forget(flow, flow.client.fileno())
        flow.client.setblocking(True)  # blocking for good: see stream.py
        flow.lock = threading.RLock()
        with self._lock:
            self.handed.add(flow)
        try:
            self.workers.submit(self._handle_blocking, flow)
        except RuntimeError as exc:  # no thread to be had (the helpers' pids limit)
            with self._lock:
                self.handed.discard(flow)
            flow.lock = None
            self._fail(flow, f"no thread to handle the connection: {exc}")
            return
        flow.done = True  # the pool thread's from here on
        self.flows.discard(flow)

    def abandon(self) -> None:
        """The loop is ending before its connections did (stop gave up waiting): close them, each
        recorded as its others are (a connection relayed: net.close; one not decided yet: refused).
        Those handed to pool threads are theirs to close."""
        for flow in list(self.flows):
            flow.done = True
            with contextlib.suppress(Exception):  # what cannot be recorded now is still closed
                self._record_abandoned(flow)
            self._close(flow)
        self.flows.clear()

    def _record_abandoned(self, flow: _Flow) -> None:
        if self._relaying(flow):
            self._record_relayed(flow)
        elif not flow.recorded:
            self._record_stopped(flow)

    def _record_stopped(self, flow: _Flow) -> None:
        """A connection the stop ended before it was decided: refused, counted and recorded so."""
        with self._lock:
            self.stats["denied"] += 1
        self._emit("net.connect", flow.event or {"connection": flow.conn_id}, _STOPPED)

    @staticmethod
    def _relaying(flow: _Flow) -> bool:
        return flow.verdict is not None and (flow.relay is not None or flow.back is not None)

    def _record_relayed(self, flow: _Flow) -> None:
        """The net.close of a connection ended on the loop while relayed, with what it moved so far."""
        assert flow.verdict is not None
        if flow.relay is not None:
            sent, received = flow.relay.moved
        else:
            assert flow.back is not None
            sent, received = (flow.out.sent if flow.out is not None else 0), flow.back.moved
        requests = flow.out.requests if flow.out is not None else 0
        self._record_close(flow.conn_id, flow.host, flow.port, flow.verdict, sent, received, flow.started, requests)

    # -- per connection, on a pool thread

    def _handle_blocking(self, flow: _Flow) -> None:
        """A WebSocket handshake's connection, on a pool thread from its decision to its end. Its
        records go through _owning(flow): once the stop has recorded it in the thread's place
        (end_handed), the thread only closes it."""
        client, reader, event = flow.client, flow.reader, flow.event
        conn_id, started, port, target = flow.conn_id, flow.started, flow.port, flow.target
        assert target is not None
        upstream: socket.socket | None = None
        try:
            assert flow.sniffed is not None
            host, name, sniffed = flow.host, flow.name, flow.sniffed
            http = sniffed.protocol == "http"
            protocol = protocol_name(sniffed, port)
            event["protocol"] = protocol
            _record_names(event, sniffed)
            verdict = self._verdict(host, name, port, protocol, sniffed, target)
            if verdict.address is not None:
                event["address"] = str(verdict.address)
            if verdict.decision == "deny" or self.closing:
                self._deny(client, event, verdict if verdict.decision == "deny" else _STOPPED, http=http, flow=flow)
                return
            assert verdict.address is not None
            try:
                upstream = dial(verdict.address, port, self.connect_timeout_s)
            except OSError as exc:
                why = Verdict("deny", "net.dial_failed", f"{verdict.address} port {port}: {exc}")
                self._deny(client, event, why, http=http, flow=flow)
                return
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            event["setup_us"] = round((time.monotonic() - started) * 1e6)
            if not self._cut_at_stop(upstream):  # the stop came during the dial: nothing of it moves
                self._deny(client, event, _STOPPED, http=http, flow=flow)
                return
            flow.upstream, flow.verdict = upstream, verdict
            with self._owning(flow):
                self._emit("net.connect", event, verdict, flow=flow)  # audited before a byte moves
                flow.recorded = True
                with self._lock:
                    self.stats["allowed"] += 1
            refused: list[Verdict] = []
            if sniffed.head is not None and is_websocket(sniffed.head):
                # The one protocol switch the filter follows, and only as a connection's first request:
                # nothing is outstanding, so the first response read back answers it.
                reader.take(sniffed.head.size)
                blocking_sends(upstream)
                upstream.sendall(sniffed.head.canonical)
                flow.requests[0] = 1
                switched = _await_switch(upstream, client, self.switch_timeout_s)
                event_switch = {"connection": conn_id, "host": host, "port": port, "switched": switched}
                self._write("net.upgrade", {**event_switch, "decision": "allow", "protocol": "ws"}, flow=flow)
                sniffed = Sniffed("tcp") if switched else Sniffed("http", head=None)

            if not sniffed.silent and sniffed.head is None and sniffed.protocol != "http":
                # A ClientHello, or opaque bytes, checked whole: every later byte is spliced, both
                # ways on this thread (which makes both sockets non-blocking).
                first = reader.take(len(reader.buffer))
                try:
                    flow.relay = Relay(client, upstream, first)
                except OSError:  # no pipe to be had: ended with nothing moved, as it is recorded
                    end_both(client, upstream)
                    sent, received = 0, 0
                else:
                    sent, received = run_relay(flow.relay)
            else:

                def outbound() -> int:
                    return self._requests(reader, upstream, host, name, event, flow.requests, refused, flow)

                blocking_sends(upstream)  # with no time limit, as the agent's socket: see stream.py
                sent, received = relay(client, upstream, self.workers, outbound, flow.moved)
            if refused:
                reset(client)  # earlier responses may still be in flight: no answer can follow them
            self._record_close(conn_id, host, port, verdict, sent, received, started, flow.requests[0], flow=flow)
        except _TakenOver:
            reset(client)  # recorded by the stop, which cut it
        except Exception as exc:  # a bug or an I/O error: the connection is refused, and that is audited
            reset(client)
            with contextlib.suppress(Exception):
                self._pool_failed(flow, f"{type(exc).__name__}: {exc}")
        finally:
            with self._lock:
                self.active.discard(client)
                if upstream is not None:
                    self.active.discard(upstream)
                self.handed.discard(flow)
            if flow.relay is not None:
                flow.relay.close()
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()
            self.ended()

    def _pool_failed(self, flow: _Flow, why: str) -> None:
        """A pool thread's connection failed: refused, recorded and counted as _fail does on the loop
        (one recorded allowed stays counted so, and gets its net.close with what it moved)."""
        with self._owning(flow):
            if not flow.recorded:
                with self._lock:
                    self.stats["denied"] += 1
            event = {**flow.event, "connection": flow.conn_id}
            relayed = flow.recorded and flow.verdict is not None
            self._emit("net.connect", event, Verdict("deny", "net.filter_error", why), flow=flow, final=not relayed)
            if relayed:
                assert flow.verdict is not None
                self._record_pool_close(flow, flow.verdict, owned=True)

    def _record_pool_close(self, flow: _Flow, verdict: Verdict, *, owned: bool) -> None:
        """The net.close of a pool thread's connection, with what it moved so far; `owned`: written
        as the thread's (see _owning), else the stop's in its place."""
        sent, received = flow.relay.moved if flow.relay is not None else (flow.moved[0], flow.moved[1])
        self._record_close(
            flow.conn_id,
            flow.host,
            flow.port,
            verdict,
            sent,
            received,
            flow.started,
            flow.requests[0],
            flow=flow if owned else None,
        )

    def _proxy_target(
        self, head: RequestHead | None, event: dict[str, Any]
    ) -> tuple[str, str | None, int, IPAddress] | Verdict:
        """A client that uses the filter as its proxy (HTTPS_PROXY=http://127.0.0.1:15001) sends
        'CONNECT host:port'. The named host is then the intended host, checked like a captured
        connection (the tunnelled SNI must match it): (host, name, port, address), or why not."""
        if head is None or head.method != "CONNECT":
            what = f"{head.method} {head.target}"[:200] if head else "no request"
            return Verdict(
                "deny", "net.proxy_request", f"only CONNECT is served here, not '{what}'; plain HTTP goes direct"
            )
        authority = head.target
        host_text, _, port_text = authority.rpartition(":")
        host_text = host_text.strip("[]")
        port = int(port_text) if port_text.isdigit() and len(port_text) <= 5 else 0
        event.update(port=port, destination=authority[:300])
        try:
            literal: IPAddress | None = ipaddress.ip_address(host_text)
        except ValueError:
            literal = None
        if literal is not None and 0 < port < 65536:
            return str(literal), None, port, literal
        try:
            name, allowed = host_allowed(self.policy, host_text)
        except (PatternError, UnicodeError) as exc:
            return Verdict("deny", "net.host_invalid", f"CONNECT {authority[:200]}: {exc}")
        if not allowed or not 0 < port < 65536:
            event["host"] = name
            return Verdict("deny", "net.host_not_allowed", f"host '{name}' matches no allowed_hosts pattern")
        return name, name, port, ipaddress.IPv4Address(0)

    def _refuse_later(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        event: dict[str, Any],
        sniffed: Sniffed,
        verdict: Verdict,
        refused: list[Verdict],
        request: int,
        flow: _Flow | None = None,
    ) -> None:
        """A refusal after the connection was allowed: audited with the names the bytes carried, then
        both sides are cut (responses to earlier requests may be in flight: no answer can follow)."""
        denial: dict[str, Any] = {
            key: event[key] for key in ("connection", "port", "destination", "host", "via") if key in event
        }
        denial.update(protocol=sniffed.protocol, request=request, address=event.get("address"))
        _record_names(denial, sniffed)
        try:
            with self._owning(flow):
                with self._lock:
                    self.stats["denied"] += 1
                refused.append(verdict)
                self._emit("net.connect", denial, verdict, flow=flow)
        finally:
            with contextlib.suppress(OSError):
                reader.sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                upstream.shutdown(socket.SHUT_RDWR)

    def _requests(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        host: str,
        name: str | None,
        event: dict[str, Any],
        count: list[int],
        refused: list[Verdict],
        flow: _Flow | None = None,
    ) -> int:
        """Move the agent's bytes upstream after a WebSocket handshake the server did not switch
        (the handshake was forwarded): HTTP requests again, each head read whole, checked like the
        first and forwarded re-serialised; bodies forwarded as their heads frame them. A refused head
        ends the connection and is audited with the names it carried. Returns how many bytes."""
        head: RequestHead | None = None
        sent = 0
        while True:
            try:
                if head is not None:
                    count[0] += 1
                    upstream.sendall(head.canonical)
                    sent += len(head.canonical)
                    sent += forward_body(reader, upstream, head, self.message_timeout_s)
                following = read_head(reader, self.message_timeout_s, idle=True)
            except ClientGone:
                return sent
            except Malformed as exc:
                bad = Sniffed("http", names=claimed_hosts(bytes(reader.buffer)))
                self._refuse_later(
                    reader,
                    upstream,
                    event,
                    bad,
                    Verdict("deny", "net.unreadable", str(exc)),
                    refused,
                    count[0] + 1,
                    flow,
                )
                return sent
            if following is None:
                return sent
            reader.take(following.size)
            verdict = _request_problem(following, host, name, first=False)
            if verdict is not None:
                self._refuse_later(
                    reader, upstream, event, Sniffed("http", head=following), verdict, refused, count[0] + 1, flow
                )
                return sent
            head = following

    def _opaque_refused(self, host: str, port: int) -> bool:
        decision = self._decide(NetworkConnect(host, port, "tcp"))
        return bool(decision.reasons) and decision.reasons[0].rule == "net.protocol_not_allowed"

    def _decide(self, question: NetworkConnect) -> Decision:
        """decide() under the filter's policy, worked out once per distinct question."""
        answer = self._decisions.get(question)
        if answer is None:
            answer = decide(self.policy, question)
            if len(self._decisions) >= MAX_KEPT_DECISIONS:
                self._decisions.clear()
            self._decisions[question] = answer
        return answer

    def _verdict(
        self,
        host: str,
        name: str | None,
        port: int,
        protocol: str,
        sniffed: Sniffed,
        target: IPAddress,
        resolved: list[IPAddress] | None = None,
    ) -> Verdict:
        """The decision on a connection's first message; `resolved`: the name's addresses, already
        known (else resolved here, which may wait for the upstream resolver)."""
        problem = _name_problem(sniffed, host, name)
        if problem is not None:
            return problem
        candidates: list[IPAddress]
        if name is None:
            candidates = [target]  # a literal address: decided as itself, dialled as itself
        else:
            try:
                candidates = resolved if resolved is not None else self.resolver.addresses(name)
            except ResolveError as exc:
                return Verdict("deny", "net.resolve_failed", str(exc))
            if not candidates:
                return Verdict("deny", "net.resolve_failed", f"'{name}' has no address upstream")
        first_denial: Verdict | None = None
        for address in candidates:
            decision = self._decide(NetworkConnect(host, port, protocol, str(address)))
            if (
                protocol in _OPAQUE_LABELS
                and decision.reasons
                and decision.reasons[0].rule == "net.protocol_not_allowed"
            ):
                # a banner names the protocol, but what follows it is as opaque as any TCP
                decision = self._decide(NetworkConnect(host, port, "tcp", str(address)))
            verdict = _from_decision(decision, address)
            if verdict.decision == "allow":
                return verdict
            first_denial = first_denial or verdict
        assert first_denial is not None
        return first_denial

    def _deny(
        self,
        client: socket.socket,
        event: dict[str, Any],
        verdict: Verdict,
        *,
        http: bool = False,
        flow: _Flow | None = None,
    ) -> None:
        try:
            with self._owning(flow):
                with self._lock:
                    self.stats["denied"] += 1
                self._emit("net.connect", event, verdict, flow=flow, final=True)
        finally:
            if http:
                _http_refusal(client, verdict)
                client.close()
            else:
                reset(client)

    def _emit(
        self, kind: str, event: dict[str, Any], verdict: Verdict, *, flow: _Flow | None = None, final: bool = False
    ) -> None:
        payload = {**event, **one_rule(verdict.decision, verdict.rule, verdict.text, verdict.pointer)}
        self._write(kind, payload, flow=flow, final=final)

    def _write(self, kind: str, payload: dict[str, Any], *, flow: _Flow | None = None, final: bool = False) -> None:
        """Write a record; one of a pool thread's connection (`flow`) only while the stop has not
        recorded that connection in its place (else _TakenOver). `final`: its last record."""
        with self._owning(flow):
            self.record(kind, payload)
            if final and flow is not None and flow.lock is not None:
                flow.taken = True

    @contextlib.contextmanager
    def _owning(self, flow: _Flow | None) -> Iterator[None]:
        """Held while a pool thread counts and records its connection: _TakenOver once the stop
        has recorded it in the thread's place."""
        if flow is None or flow.lock is None:
            yield
            return
        with flow.lock:
            if flow.taken:
                raise _TakenOver
            yield

    def end_handed(self, timeout: float) -> int:
        """The stop, once it has waited for the pool threads: each connection of theirs not over yet
        is cut and recorded here (net.close with what it moved so far; refused when it was not
        decided), and its thread records nothing more. Returns how many could not be: a record of
        theirs still being written after `timeout`, or one of these that could not be written."""
        deadline = time.monotonic() + timeout
        with self._lock:
            handed = list(self.handed)
        unfinished = 0
        for flow in handed:
            assert flow.lock is not None
            if not flow.lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                unfinished += 1
                continue
            try:
                if flow.taken:
                    continue
                flow.taken = True
                recorded, verdict = flow.recorded, flow.verdict
            finally:
                flow.lock.release()
            for sock in (flow.client, flow.upstream):
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
            try:
                if recorded and verdict is not None:
                    self._record_pool_close(flow, verdict, owned=False)  # taken over: no longer the thread's
                else:
                    self._record_stopped(flow)
            except Exception:
                unfinished += 1
        return unfinished

    def refuse_over_limit(self, client: socket.socket, limit: int) -> None:
        self.refuse(
            client, Verdict("deny", "net.too_many_connections", f"the session already has {limit} open connections")
        )

    def refuse(self, client: socket.socket, verdict: Verdict = _STOPPED) -> None:
        """Refuse a connection no handler took (reset), counted and recorded as every refusal is."""
        with self._lock:
            self.stats["connections"] += 1
        self._deny(client, {"connection": next(self._ids)}, verdict)

    def _cut_at_stop(self, upstream: socket.socket) -> bool:
        """Have the stop cut a dialled upstream socket from now on; False: the stop came already."""
        with self._lock:  # checked and added together: shutdown_all cuts it, or it was never added
            if self.closing:
                return False
            self.active.add(upstream)
            return True

    def shutdown_all(self) -> None:
        """The stop: connections taken from now on are refused; open ones are cut."""
        with self._lock:
            self.closing = True
            socks = list(self.active)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


def _nothing() -> None:
    pass


def _gone(sniffed: Sniffed | None, why: str) -> Sniffed:
    """The answer when the agent closed before finishing its first message (`sniffed`: what it had sent)."""
    if sniffed is None:
        return Sniffed("tcp", malformed=f"client went away before sending anything ({why})")
    return Sniffed(sniffed.protocol, malformed=f"client went away mid-message ({why})")


def _overdue(sniffed: Sniffed, timeout_s: float, size: int) -> Sniffed:
    """The answer when a started first message was not finished within `timeout_s`."""
    what = {"tls": "TLS ClientHello", "http": "HTTP request head"}.get(sniffed.protocol, "first message")
    return Sniffed(sniffed.protocol, malformed=f"incomplete {what} after {timeout_s:g} s ({size} bytes)")


def _record_names(event: dict[str, Any], sniffed: Sniffed) -> None:
    """Every name the bytes carried goes into the record, allowed or not."""
    if sniffed.protocol == "tls" and sniffed.server_name:
        event["sni"] = sniffed.server_name[:300]
    if sniffed.head is None and sniffed.protocol == "http" and sniffed.names:
        event["http_host"] = ", ".join(sniffed.names)[:300]  # what an unreadable head seemed to name
    if sniffed.head is not None:
        if sniffed.head.host_header is not None:
            event["http_host"] = sniffed.head.host_header[:300]
        if sniffed.head.target_host is not None:
            event["http_target_host"] = sniffed.head.target_host[:300]
        if sniffed.head.forwarded_hosts:
            event["http_forwarded_hosts"] = [h[:300] for h in sniffed.head.forwarded_hosts[:4]]
        event["http_method"] = sniffed.head.method[:40]


def _name_problem(sniffed: Sniffed, host: str, name: str | None, *, first: bool = True) -> Verdict | None:
    """Why the first message may not go to the connection's host (None: it may)."""
    if sniffed.malformed:
        rule = "net.incomplete" if sniffed.malformed.startswith("incomplete") else "net.unreadable"
        return Verdict("deny", rule, sniffed.malformed)
    if sniffed.head is not None:
        return _request_problem(sniffed.head, host, name, first=first)
    if sniffed.protocol != "tls":
        return None
    if sniffed.server_name and not _same_host(sniffed.server_name, host):
        return Verdict(
            "deny",
            "net.host_mismatch",
            f"TLS SNI '{sniffed.server_name}' does not match the host the agent connected to ('{host}')",
        )
    if sniffed.ech:
        return Verdict(
            "deny",
            "net.ech",
            "the ClientHello carries an encrypted inner ClientHello (ECH): the server name it really asks "
            "for cannot be checked",
        )
    if sniffed.server_name is None and name is not None:
        return Verdict(
            "deny",
            "net.sni_missing",
            f"TLS to the name '{name}' without SNI: the server would pick a name the filter cannot check "
            "(only literal-address connections may go without, RFC 6066)",
        )
    return None


def _request_problem(head: RequestHead, host: str, name: str | None, *, first: bool) -> Verdict | None:
    """Why a request head may not go to the connection's host (None: it may)."""
    claims = [(head.host_header, "HTTP Host"), (head.target_host, "HTTP request target")]
    claims += [(forwarded, "HTTP forwarding header") for forwarded in head.forwarded_hosts]
    for claimed, what in claims:
        if claimed is not None and not _same_host(claimed, host):
            return Verdict(
                "deny",
                "net.host_mismatch",
                f"{what} '{claimed}' does not match the host the agent connected to ('{host}')",
            )
    if not head.names and name is not None:
        return Verdict(
            "deny",
            "net.host_missing",
            f"HTTP request to the name '{name}' without a Host: the server would pick a name the filter cannot check",
        )
    if head.method.upper() == "CONNECT":
        return Verdict("deny", "net.unreadable", "CONNECT inside a captured connection: the tunnel could not be read")
    if head.body != "none" and head.method.upper() in ("GET", "HEAD", "TRACE"):
        # RFC 9110 9.3: such content has no semantics; a server that ignores it reads it as the next
        # request, one the filter took for a body and never checked
        return Verdict("deny", "net.unreadable", f"a {head.method} request with content (request smuggling)")
    upgrade = fields(head.headers, "upgrade")
    if upgrade and not (first and is_websocket(head)):
        where = "" if first else " on a kept-alive connection"
        return Verdict(
            "deny",
            "net.unreadable",
            f"protocol switch to '{', '.join(upgrade)[:100]}'{where}: the filter follows only a WebSocket "
            "handshake that opens a connection",
        )
    return None


def _await_switch(upstream: socket.socket, client: socket.socket, timeout_s: float) -> bool:
    """Pass the server's answer to a WebSocket handshake back to the agent; True when it switched
    (101). Anything else, or no answer in time, leaves the connection plain HTTP: every later byte from
    the agent is then read as a request head, the safe reading either way."""
    data = b""
    deadline = time.monotonic() + timeout_s
    poller = select.poll()
    poller.register(upstream, select.POLLIN)
    status = 0
    while True:
        end = head_end(data)
        if end >= 0:
            words = data[:end].split(b" ", 2)
            status = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
            if 100 <= status < 200 and status != 101:  # an interim answer: the real one follows
                client.sendall(data[:end])
                data = data[end:]
                continue
            break
        if len(data) > MAX_HTTP_HEAD or not poller.poll(max(0, round((deadline - time.monotonic()) * 1000))):
            break
        chunk = upstream.recv(65536)
        if not chunk:
            break
        data += chunk
    client.sendall(data)
    return status == 101


def _same_host(claimed: str, host: str) -> bool:
    try:
        return normalize_host(claimed) == normalize_host(host)
    except (PatternError, UnicodeError):
        with contextlib.suppress(ValueError):
            return ipaddress.ip_address(claimed) == ipaddress.ip_address(host)
        return False


def _from_decision(decision: Decision, address: IPAddress) -> Verdict:
    reason = decision.reasons[0] if decision.reasons else None
    return Verdict(
        "allow" if decision.verdict == "ALLOW" else "deny",
        reason.rule if reason else "net.default_deny",
        reason.text if reason else "denied",
        address,
        reason.pointer if reason else "",
    )


def _refusal_answer(verdict: Verdict) -> bytes:
    body = f"adl-enforcer: connection denied ({verdict.rule}): {verdict.text}\n".encode()
    head = (
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"X-ADL-Enforcer-Rule: {verdict.rule}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    return head + body


def _http_refusal(client: socket.socket, verdict: Verdict) -> None:
    """A plain-HTTP client gets a readable answer instead of a bare reset."""
    answer = _refusal_answer(verdict)
    with contextlib.suppress(OSError):
        client.recv(65536, socket.MSG_DONTWAIT)  # consume the request: closing over unread bytes resets
    with contextlib.suppress(OSError):
        client.settimeout(1.0)
        client.sendall(answer)
        client.shutdown(socket.SHUT_WR)
        while client.recv(65536):  # until the client closes (bounded by the timeout)
            pass
