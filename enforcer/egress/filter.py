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
import ipaddress
import itertools
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from ..audit.events import one_rule
from ..policy import Decision, NetworkConnect, Policy, decide
from ..policy.patterns import PatternError, normalize_host
from .dns import IPAddress, ResolveError, SyntheticAddresses, UpstreamResolver, host_allowed
from .relay import pump, relay, relay_here
from .sniff import (
    MAX_HTTP_HEAD,
    Malformed,
    RequestHead,
    Sniffed,
    claimed_hosts,
    fields,
    head_end,
    is_websocket,
    protocol_name,
)
from .stream import ClientGone, ClientReader, forward_body, read_head, sniff_first

SO_ORIGINAL_DST = 80  # linux/netfilter_ipv4.h; IP6T_SO_ORIGINAL_DST has the same value
_OPAQUE_LABELS = frozenset({"ssh"})  # what the filter names from a banner but cannot read past
Record = Callable[[str, dict[str, Any]], None]  # (kind, payload); raises when it cannot be written
# decide() answers kept per filter; the agent chooses the questions (hosts, ports, addresses), so
# the memory is bounded: past this many, it starts again empty.
MAX_KEPT_DECISIONS = 4096


@dataclass
class Verdict:
    decision: str  # allow | deny
    rule: str
    text: str
    address: IPAddress | None = None
    pointer: str = ""


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
        self.stats = {"connections": 0, "allowed": 0, "denied": 0, "bytes_out": 0, "bytes_in": 0}

    # -- per connection, in its own thread

    def handle(self, client: socket.socket) -> None:
        started = time.monotonic()
        conn_id = next(self._ids)
        with self._lock:
            self.stats["connections"] += 1
            self.active.add(client)
        upstream: socket.socket | None = None
        try:
            try:
                target, port = original_destination(client)
            except OSError:
                target, port = None, 0
            event: dict[str, Any] = {"connection": conn_id, "port": port, "destination": str(target)}
            if target is None:
                self._deny(client, event, Verdict("deny", "net.not_captured", "no original destination"))
                return
            if client.gettimeout() is not None:
                client.settimeout(None)  # blocking for good: see stream.py
            with contextlib.suppress(OSError):  # a response's head and body are separate writes
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = ClientReader(client)
            if target.is_loopback and port == self.listen_port:
                tunnel = self._connect_request(reader, event)  # the agent asked for us as its HTTPS proxy
                if tunnel is None:
                    return
                host, name, port, target = tunnel
            else:
                name = self.synthetic.name_for(target)  # None: a literal address
                host = name or str(target)
            event["host"] = host
            sniffed = sniff_first(reader, self.sniff_timeout_s, self.message_timeout_s)
            if sniffed.silent and self._opaque_refused(host, port):
                # tcp would be refused anyway: give a slow client time to say what it speaks
                sniffed = sniff_first(reader, self.message_timeout_s, self.message_timeout_s)
            protocol = protocol_name(sniffed, port)
            event["protocol"] = protocol
            _record_names(event, sniffed)
            verdict = self._verdict(host, name, port, protocol, sniffed, target)
            if verdict.address is not None:
                event["address"] = str(verdict.address)
            if verdict.decision == "deny":
                self._deny(client, event, verdict, http=sniffed.protocol == "http")
                return
            assert verdict.address is not None
            try:
                upstream = dial(verdict.address, port, self.connect_timeout_s)
            except OSError as exc:
                self._deny(
                    client,
                    event,
                    Verdict("deny", "net.dial_failed", f"{verdict.address} port {port}: {exc}"),
                    http=sniffed.protocol == "http",
                )
                return
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            event["setup_us"] = round((time.monotonic() - started) * 1e6)
            with self._lock:
                self.active.add(upstream)
            self._emit("net.connect", event, verdict)  # audited before a byte moves
            with self._lock:
                self.stats["allowed"] += 1
            requests = [0]
            refused: list[Verdict] = []
            if sniffed.head is not None and is_websocket(sniffed.head):
                # The one protocol switch the filter follows, and only as a connection's first request:
                # nothing is outstanding, so the first response read back answers it.
                reader.take(sniffed.head.size)
                blocking_sends(upstream)
                upstream.sendall(sniffed.head.canonical)
                requests[0] = 1
                switched = _await_switch(upstream, client, self.switch_timeout_s)
                event_switch = {"connection": conn_id, "host": host, "port": port, "switched": switched}
                self.record("net.upgrade", {**event_switch, "decision": "allow", "protocol": "ws"})
                sniffed = Sniffed("tcp") if switched else Sniffed("http", head=None)

            if not sniffed.silent and sniffed.head is None and sniffed.protocol != "http":
                # A ClientHello, or opaque bytes, checked whole: every later byte is spliced, both
                # ways on this thread (which makes both sockets non-blocking).
                sent, received = relay_here(client, upstream, reader.take(len(reader.buffer)))
            else:

                def outbound() -> int:
                    return self._client_side(reader, upstream, sniffed, host, name, event, requests, refused)

                blocking_sends(upstream)  # with no time limit, as the agent's socket: see stream.py
                sent, received = relay(client, upstream, self.workers, outbound)
            if refused:
                reset(client)  # earlier responses may still be in flight: no answer can follow them
            with self._lock:
                self.stats["bytes_out"] += sent
                self.stats["bytes_in"] += received
            closing: dict[str, Any] = {
                "connection": conn_id,
                "host": host,
                "port": port,
                "address": str(verdict.address),
                "bytes_out": sent,
                "bytes_in": received,
                "duration_ms": round((time.monotonic() - started) * 1000, 3),
            }
            if requests[0]:
                closing["requests"] = requests[0]
            self.record("net.close", closing)
        except Exception as exc:  # a bug or an I/O error: the connection is refused, and that is audited
            reset(client)
            with contextlib.suppress(Exception):
                error = one_rule("deny", "net.filter_error", f"{type(exc).__name__}: {exc}")
                self.record("net.connect", {"connection": conn_id, **error})
        finally:
            with self._lock:
                self.active.discard(client)
                if upstream is not None:
                    self.active.discard(upstream)
            for sock in (client, upstream):
                if sock is not None:
                    sock.close()

    def _connect_request(
        self, reader: ClientReader, event: dict[str, Any]
    ) -> tuple[str, str | None, int, IPAddress] | None:
        """A client that uses the filter as its proxy (HTTPS_PROXY=http://127.0.0.1:15001) sends
        'CONNECT host:port'. The named host is then the intended host, checked like a captured
        connection (the tunnelled SNI must match it). Returns None when it was refused."""
        event["via"] = "connect"
        client = reader.sock
        try:
            head = read_head(reader, self.message_timeout_s, idle=False)
        except Malformed as exc:
            self._deny(
                client, event, Verdict("deny", "net.proxy_request", f"unreadable proxy request: {exc}"), http=True
            )
            return None
        if head is None or head.method != "CONNECT":
            what = f"{head.method} {head.target}"[:200] if head else "no request"
            self._deny(
                client,
                event,
                Verdict(
                    "deny", "net.proxy_request", f"only CONNECT is served here, not '{what}'; plain HTTP goes direct"
                ),
                http=True,
            )
            return None
        reader.take(head.size)
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
            self._deny(
                client, event, Verdict("deny", "net.host_invalid", f"CONNECT {authority[:200]}: {exc}"), http=True
            )
            return None
        if not allowed or not 0 < port < 65536:
            event["host"] = name
            self._deny(
                client,
                event,
                Verdict("deny", "net.host_not_allowed", f"host '{name}' matches no allowed_hosts pattern"),
                http=True,
            )
            return None
        with contextlib.suppress(OSError):
            client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
        return name, name, port, ipaddress.IPv4Address(0)

    def _client_side(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        sniffed: Sniffed,
        host: str,
        name: str | None,
        event: dict[str, Any],
        count: list[int],
        refused: list[Verdict],
    ) -> int:
        """Move the agent's bytes upstream; returns how many. TLS and opaque bytes are spliced once
        their first message is through; plain HTTP goes head by head."""
        if sniffed.silent:
            # It waited for the server. Whatever it sends first, however late, is still read whole and
            # its names checked: a pause before the first byte must not skip the check.
            late = sniff_first(reader, None, self.message_timeout_s)
            if late.malformed and not reader.buffer:
                return 0  # it left without sending anything
            problem = _name_problem(late, host, name, first=False)  # no switch is followed here
            if problem is not None:
                self._refuse_later(reader, upstream, event, late, problem, refused, count[0] + 1)
                return 0
            sniffed = late
        if sniffed.head is not None:
            reader.take(sniffed.head.size)
            return self._requests(reader, upstream, sniffed.head, host, name, event, count, refused)
        if sniffed.protocol == "http":  # the server did not switch: what follows are HTTP requests again
            return self._requests(reader, upstream, None, host, name, event, count, refused)
        first = reader.take(len(reader.buffer))  # a silent client's first bytes
        upstream.sendall(first)
        return len(first) + pump(reader.sock, upstream)

    def _refuse_later(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        event: dict[str, Any],
        sniffed: Sniffed,
        verdict: Verdict,
        refused: list[Verdict],
        request: int,
    ) -> None:
        """A refusal after the connection was allowed: audited with the names the bytes carried, then
        both sides are cut (responses to earlier requests may be in flight: no answer can follow)."""
        denial: dict[str, Any] = {
            key: event[key] for key in ("connection", "port", "destination", "host", "via") if key in event
        }
        denial.update(protocol=sniffed.protocol, request=request, address=event.get("address"))
        _record_names(denial, sniffed)
        with self._lock:
            self.stats["denied"] += 1
        refused.append(verdict)
        self._emit("net.connect", denial, verdict)
        with contextlib.suppress(OSError):
            reader.sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)

    def _requests(
        self,
        reader: ClientReader,
        upstream: socket.socket,
        head: RequestHead | None,
        host: str,
        name: str | None,
        event: dict[str, Any],
        count: list[int],
        refused: list[Verdict],
    ) -> int:
        """Move a plain-HTTP connection's requests: each head is read whole, checked like the first
        and forwarded re-serialised; bodies are forwarded as their heads frame them. A refused head
        ends the connection and is audited with the names it carried. `head` None: the first one
        was already forwarded."""
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
                    reader, upstream, event, bad, Verdict("deny", "net.unreadable", str(exc)), refused, count[0] + 1
                )
                return sent
            if following is None:
                return sent
            reader.take(following.size)
            verdict = _request_problem(following, host, name, first=False)
            if verdict is not None:
                self._refuse_later(
                    reader, upstream, event, Sniffed("http", head=following), verdict, refused, count[0] + 1
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
        self, host: str, name: str | None, port: int, protocol: str, sniffed: Sniffed, target: IPAddress
    ) -> Verdict:
        problem = _name_problem(sniffed, host, name)
        if problem is not None:
            return problem
        if name is None:
            candidates: list[IPAddress] = [target]  # a literal address: decided as itself, dialled as itself
        else:
            try:
                candidates = self.resolver.addresses(name)
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

    def _deny(self, client: socket.socket, event: dict[str, Any], verdict: Verdict, *, http: bool = False) -> None:
        with self._lock:
            self.stats["denied"] += 1
        try:
            self._emit("net.connect", event, verdict)
        finally:
            if http:
                _http_refusal(client, verdict)
                client.close()
            else:
                reset(client)

    def _emit(self, kind: str, event: dict[str, Any], verdict: Verdict) -> None:
        self.record(kind, {**event, **one_rule(verdict.decision, verdict.rule, verdict.text, verdict.pointer)})

    def refuse_over_limit(self, client: socket.socket, limit: int) -> None:
        with self._lock:
            self.stats["connections"] += 1
        self._deny(
            client,
            {"connection": next(self._ids)},
            Verdict("deny", "net.too_many_connections", f"the session already has {limit} open connections"),
        )

    def shutdown_all(self) -> None:
        with self._lock:
            socks = list(self.active)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


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


def _http_refusal(client: socket.socket, verdict: Verdict) -> None:
    """A plain-HTTP client gets a readable answer instead of a bare reset."""
    body = f"adl-enforcer: connection denied ({verdict.rule}): {verdict.text}\n".encode()
    head = (
        "HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"X-ADL-Enforcer-Rule: {verdict.rule}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    with contextlib.suppress(OSError):
        client.recv(65536, socket.MSG_DONTWAIT)  # consume the request: closing over unread bytes resets
    with contextlib.suppress(OSError):
        client.settimeout(1.0)
        client.sendall(head + body)
        client.shutdown(socket.SHUT_WR)
        while client.recv(65536):  # until the client closes (bounded by the timeout)
            pass
