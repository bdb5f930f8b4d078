"""The connection filter's loop under connections the agent controls: many at once, silent or
half-sent first messages, an upstream that never completes the handshake, half-closes and urgent
data. One thread steps every TLS or opaque connection, so nothing one connection does may hold the
others, and every connection is still accounted for in the records and the summary.

No namespace here: the connections reach the filter's listener directly, and the original
destination nftables would have kept is the synthetic address the DNS stub gave for the name. The
names resolve to loopback addresses of this test's own (treated as public for the test).
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import random
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer.egress import filter as connection_filter
from enforcer.egress.loop import Loop
from enforcer.egress.netns import AgentNamespace

from ..helpers.documents import base_adl, compile_doc
from ..unit.test_egress_process import RecordingListener, Setup, audit_records, wait_for

GOOD, STALLED, WEB = "api.example.test", "slow.example.test", "web.example.test"
PROXY = "the filter as a proxy"
PORT = 443
SO_SNDBUFFORCE = 32  # asm-generic/socket.h: a send buffer past wmem_max (root)


class Upstream:
    """A server on a loopback address of its own: answers b"PONG\n" to a line, then echoes
    whatever follows until the client's end, then closes."""

    def __init__(self) -> None:
        self.address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        self.listener = socket.create_server((self.address, PORT), backlog=128)
        self.received: list[bytes] = []
        self._threads: list[threading.Thread] = []
        self._running = True
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while self._running:
            try:
                conn, _ = self.listener.accept()
            except OSError as exc:
                # Out of descriptors while a test holds them all (this server shares the test's
                # process): the connection stays queued, taken once they are given back.
                if exc.errno in (errno.EMFILE, errno.ENFILE) and self._running:
                    time.sleep(0.01)
                    continue
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, conn: socket.socket) -> None:
        got = b""
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            while b"\n" not in got:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                got += chunk
            conn.sendall(b"PONG\n")
            while chunk := conn.recv(4096):
                got += chunk
                conn.sendall(chunk)
        self.received.append(got)

    def close(self) -> None:
        self._running = False
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._accepting.join(5)


class HttpUpstream(Upstream):
    """Keeps every byte it receives; answers each request line it sees with a short 200."""

    def _serve(self, conn: socket.socket) -> None:
        got = b""
        answered = 0
        with conn, contextlib.suppress(OSError):
            conn.settimeout(10)
            while chunk := conn.recv(65536):
                got += chunk
                while got.count(b" HTTP/1.1\r\n") > answered:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                    answered += 1
        self.received.append(got)


class Stalled:
    """A listener whose accept queue is full and never taken from: a SYN to it goes unanswered, as
    from a host that drops the filter's handshake."""

    def __init__(self) -> None:
        self.address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        self.listener = socket.create_server((self.address, PORT), backlog=0)
        self.queued: list[socket.socket] = []
        with contextlib.suppress(OSError):
            for _ in range(4):  # fills the queue: later handshakes are not completed
                sock = socket.socket()
                sock.setblocking(False)
                sock.connect_ex((self.address, PORT))
                self.queued.append(sock)
        time.sleep(0.1)

    def close(self) -> None:
        for sock in self.queued:
            sock.close()
        self.listener.close()


class Loopside:
    """A filter server whose listener the test's clients connect to, serving until stop()."""

    def __init__(
        self, setup: Setup, monkeypatch: pytest.MonkeyPatch, upstream: Upstream, stalled: Stalled, web: Upstream
    ) -> None:
        self.setup = setup
        connections = setup.connections
        connections.policy = compile_doc(
            setup.schemas,
            base_adl(permissions={"network": {"allowed_hosts": [GOOD, STALLED, WEB], "allowed_ports": [PORT]}}),
            public_test_ranges=["127.0.0.0/8"],
        )
        connections.resolver.zone = {  # type: ignore[attr-defined]
            GOOD: [upstream.address],
            STALLED: [stalled.address],
            WEB: [web.address],
        }
        self.synthetic = {name: connections.synthetic.address_for(name, 4) for name in (GOOD, STALLED, WEB)}
        self.meant: dict[int, str] = {}  # the agent's port -> the name it connected to

        def destination(sock: socket.socket) -> tuple[Any, int]:
            meant = self.meant[sock.getpeername()[1]]
            if meant == PROXY:  # the agent dialled the filter itself, as its HTTPS proxy
                return ipaddress.IPv4Address("127.0.0.1"), connections.listen_port
            return self.synthetic[meant], PORT

        monkeypatch.setattr(connection_filter, "original_destination", destination)
        self.listener = RecordingListener()
        self.ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.theirs = theirs
        space = AgentNamespace(netns_fd=-1, tcp=[self.listener], dns_udp=[], dns_tcp=[], ipv6=False)
        self.result: dict[str, Any] = {}
        self.failure: list[BaseException] = []
        self.serving = threading.Thread(target=self._serve, args=(space,))
        self.serving.start()
        self.summary: dict[str, Any] | None = None

    def _serve(self, space: AgentNamespace) -> None:
        try:
            self.result["dropped"] = self.setup.server.serve(self.theirs, space)
        except BaseException as exc:
            self.failure.append(exc)

    def connect(self, name: str) -> socket.socket:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.meant[sock.getsockname()[1]] = name
        sock.connect(self.listener.getsockname())
        sock.settimeout(10)
        return sock

    def stop(self) -> dict[str, Any]:
        self.ours.send(b"stop {}")
        self.serving.join(10)
        assert not self.serving.is_alive() and not self.failure, self.failure
        self.summary = self.setup.server.stop(self.result["dropped"])
        return self.summary

    def close(self) -> None:
        if self.serving.is_alive():
            self.ours.send(b"stop {}")
            self.serving.join(10)
            self.setup.server.stop({})
        for sock in (self.ours, self.theirs, self.listener):
            sock.close()


@pytest.fixture
def loopside(schemas: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loopside]:
    setup = Setup(schemas, tmp_path, max_connections=256)
    setup.schemas = schemas  # type: ignore[attr-defined]
    upstream, stalled, web = Upstream(), Stalled(), HttpUpstream()
    made = Loopside(setup, monkeypatch, upstream, stalled, web)
    made.upstream = upstream  # type: ignore[attr-defined]
    made.web = web  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        made.close()
        upstream.close()
        stalled.close()
        web.close()
        setup.close()


def ping(sock: socket.socket) -> bytes:
    sock.sendall(b"PING\n")
    return sock.recv(16)


def records(loopside: Loopside) -> list[dict[str, Any]]:
    loopside.setup.writer.sync()
    return [
        r["payload"] | {"kind": r["intent"].removeprefix("adl.enforcer.")} for r in audit_records(loopside.setup.log)
    ]


def starve_one(loopside: Loopside, spare: int) -> dict[str, Any]:
    """A connection accepted, then all but `spare` of the descriptors the process may open taken
    (a lowered soft limit keeps that cheap) before it speaks: it must be reset. Once they are given
    back, the next connection is relayed. The session's summary."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    starved = loopside.connect(GOOD)
    try:
        wait_for(lambda: loopside.setup.server.handlers.value == 1)  # accepted: it waits for its first bytes
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        for _ in range(spare):
            os.close(held.pop())
        starved.sendall(b"PING\n")
        with pytest.raises(ConnectionResetError):
            starved.recv(1)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        starved.close()
    with loopside.connect(GOOD) as later:
        assert ping(later) == b"PONG\n"
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    return loopside.stop()


def test_many_open_connections_are_relayed_without_a_thread_each(loopside: Loopside) -> None:
    """Forty connections open at once, each relayed both ways: the filter holds them on its loop,
    not on forty threads; each is recorded when allowed and when closed, and counted."""
    first = loopside.connect(GOOD)
    assert ping(first) == b"PONG\n"  # starts the loop (and resolves the name once)
    clients: list[socket.socket] = []
    try:
        for _ in range(40):  # each speaks first at once (a silent one would go on on a pool thread)
            clients.append(loopside.connect(GOOD))
            clients[-1].sendall(b"PING\n")
        for client in clients:
            assert client.recv(16) == b"PONG\n"
        for index, client in enumerate(clients):
            client.sendall(b"echo %d" % index)
            assert client.recv(64) == b"echo %d" % index
        pool = len(loopside.setup.workers._threads)  # type: ignore[attr-defined]
        assert pool <= 2, f"{pool} filter threads for 40 open connections"  # the loop's, and one that resolved
    finally:
        for client in (first, *clients):
            client.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    summary = loopside.stop()
    assert summary["connections"] == {**summary["connections"], "connections": 41, "allowed": 41, "denied": 0}
    kinds = [r["kind"] for r in records(loopside)]
    assert kinds.count("net.connect") == 41 and kinds.count("net.close") == 41


def test_silent_half_sent_and_unanswered_connections_do_not_hold_the_others(loopside: Loopside) -> None:
    """A connection whose upstream never answers the handshake, one that sends half a ClientHello
    and stops, and one that sends nothing: while they wait for their deadlines (each on the loop's
    timer heap), other connections are relayed at once; then each ends as its deadline says, and
    is recorded."""
    stalled = loopside.connect(STALLED)
    stalled.sendall(b"PING\n")  # opaque bytes, decided at once: the dial then hangs
    half = loopside.connect(GOOD)
    half.sendall(bytes([0x16, 0x03, 0x01, 0x02, 0x00]) + b"\x01\x00")  # a ClientHello's first bytes
    silent = loopside.connect(GOOD)
    try:
        for _ in range(5):
            started = time.monotonic()
            with loopside.connect(GOOD) as quick:
                assert ping(quick) == b"PONG\n"
            assert time.monotonic() - started < 0.5
        with pytest.raises(ConnectionResetError):  # message_timeout_s (1 s): refused
            half.recv(1)
        with pytest.raises(ConnectionResetError):  # connect_timeout_s (1 s): refused
            stalled.recv(1)
        assert ping(silent) == b"PONG\n"  # silent past sniff_timeout_s: a server-speaks-first client
    finally:
        for sock in (stalled, half, silent):
            sock.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    summary = loopside.stop()
    assert summary["connections"] == {**summary["connections"], "connections": 8, "allowed": 6, "denied": 2}
    refused = {r["rules"][0]: r for r in records(loopside) if r.get("decision") == "deny"}
    assert set(refused) == {"net.incomplete", "net.dial_failed"}
    assert "no connection within 1 s" in refused["net.dial_failed"]["reasons"][0]["text"]
    assert refused["net.dial_failed"]["host"] == STALLED


def test_half_close_and_urgent_data_on_the_loop(loopside: Loopside) -> None:
    """The agent sends an urgent byte in the middle of its first message, then shuts its side for
    writing: the loop neither spins on the urgent byte (poll says what follows an urgent byte is
    readable; recv does not return it alone) nor loses the bytes around it, and the answer the
    server writes after the agent's end still arrives."""
    client = loopside.connect(GOOD)
    try:
        client.sendall(b"PI")  # may become a request line: the sniff waits for the rest
        time.sleep(0.05)
        client.send(b"!", socket.MSG_OOB)
        before = _pool_cpu(loopside)
        time.sleep(0.6)  # the urgent byte pending, within the message's deadline: a spinning loop burns this
        loop_cpu = _pool_cpu(loopside) - before
        client.sendall(b"NG\n")
        assert client.recv(16) == b"PONG\n"
        client.sendall(b"last words")
        client.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := client.recv(64):
            got += chunk
        assert got == b"last words"
    finally:
        client.close()
    assert loop_cpu < 0.2, f"{loop_cpu:.2f} s of CPU with an urgent byte pending"
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    assert loopside.upstream.received == [b"PING\nlast words"]  # type: ignore[attr-defined]
    closing = [r for r in records(loopside) if r["kind"] == "net.close"]
    assert len(closing) == 1 and closing[0]["bytes_out"] == len(b"PING\nlast words")


def test_out_of_descriptors_at_the_dial_refuses_that_connection_and_the_loop_serves_on(loopside: Loopside) -> None:
    """The agent's connections take the filter's last descriptors: the one whose upstream socket
    cannot be made is refused and recorded (never relayed unrecorded, never the loop's end), and
    the next one, once descriptors are free, is relayed."""
    first = loopside.connect(GOOD)
    assert ping(first) == b"PONG\n"
    first.close()
    upstream: Upstream = loopside.upstream  # type: ignore[attr-defined]
    wait_for(lambda: loopside.setup.server.handlers.value == 0 and len(upstream.received) == 1)  # all closed
    summary = starve_one(loopside, spare=0)  # none left for its upstream socket
    assert summary["connections"] == {**summary["connections"], "connections": 3, "allowed": 2, "denied": 1}
    [refused] = [r for r in records(loopside) if r.get("decision") == "deny"]
    assert refused["rules"] == ["net.dial_failed"] and "Too many open files" in refused["reasons"][0]["text"]


def _pool_cpu(loopside: Loopside) -> float:
    """CPU seconds the filter's pool threads (the loop's among them) have used, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for thread in list(loopside.setup.workers._threads):  # type: ignore[attr-defined]
        with contextlib.suppress(OSError), open(f"/proc/self/task/{thread.native_id}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def test_work_posted_after_the_loop_ended_writes_nowhere() -> None:
    """A resolution that finishes after the loop ended posts its result: the loop's wake pipe is
    closed by then and its numbers may already belong to another descriptor, which must not
    receive the wake byte."""
    loop = Loop(os.pipe2(os.O_CLOEXEC))
    wake = loop._wake
    loop.close()
    reused = os.pipe2(os.O_CLOEXEC)  # takes the lowest free numbers: the closed pipe's
    try:
        assert set(reused) & set(wake)
        loop.post(lambda: None)
        os.set_blocking(reused[0], False)
        with pytest.raises(BlockingIOError):
            os.read(reused[0], 1)
    finally:
        for end in reused:
            os.close(end)


def test_timers_set_and_cancelled_by_connections_stay_bounded() -> None:
    """Each connection sets and cancels deadlines; an agent opening and closing connections fast
    must not grow the timer heap with cancelled ones."""
    loop = Loop(os.pipe2(os.O_CLOEXEC))
    try:
        far = time.monotonic() + 3600
        for _ in range(20000):
            loop.cancel(loop.call_at(far, lambda: None))
        assert len(loop._timers) <= 2048 and loop.timers() == 0
        fired: list[int] = []
        loop.call_at(time.monotonic(), lambda: fired.append(1))
        loop.run_once()
        assert fired == [1]
    finally:
        loop.close()


def read_answer(sock: socket.socket) -> bytes:
    """One short answer of the HTTP upstream (its head and 2-byte body)."""
    got = b""
    while not (b"\r\n\r\n" in got and got.endswith(b"ok")):
        chunk = sock.recv(4096)
        if not chunk:
            break
        got += chunk
    return got


def test_every_request_on_a_kept_alive_connection_is_checked_on_the_loop(loopside: Loopside) -> None:
    """Plain HTTP on the loop: a head written a byte at a time is read whole; a body by its length
    (part of it in the head's segment, the rest later) and a chunked one with trailers are forwarded
    as framed; each head goes upstream re-serialised; a later head naming another host is refused
    with its request number, cuts the connection, and never reaches the server."""
    client = loopside.connect(WEB)
    try:
        for byte in b"GET /one HTTP/1.1\nHost: web.example.test\n\n":
            client.send(bytes([byte]))
        assert read_answer(client).startswith(b"HTTP/1.1 200 OK")
        client.sendall(b"POST /two HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: 10\r\n\r\n01234")
        time.sleep(0.1)
        client.sendall(b"56789")
        assert read_answer(client).startswith(b"HTTP/1.1 200 OK")
        client.sendall(
            b"POST /three HTTP/1.1\r\nHost: web.example.test\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5;x=y\r\nhello\r\n0\r\nTrailer-One: 1\r\n\r\n"
        )
        assert read_answer(client).startswith(b"HTTP/1.1 200 OK")
        client.sendall(b"GET /four HTTP/1.1\r\nHost: evil.example.test\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(4096) == b""
    finally:
        client.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    web: HttpUpstream = loopside.web  # type: ignore[attr-defined]
    wait_for(lambda: len(web.received) == 1)
    assert web.received[0] == (
        b"GET /one HTTP/1.1\r\nHost: web.example.test\r\n\r\n"
        b"POST /two HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: 10\r\n\r\n0123456789"
        b"POST /three HTTP/1.1\r\nHost: web.example.test\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n0\r\nTrailer-One: 1\r\n\r\n"
    )
    written = records(loopside)
    [refused] = [r for r in written if r.get("decision") == "deny"]
    assert refused["rules"] == ["net.host_mismatch"] and refused["request"] == 4
    assert refused["http_host"] == "evil.example.test"
    [closing] = [r for r in written if r["kind"] == "net.close"]
    assert closing["requests"] == 3 and closing["bytes_out"] == len(web.received[0])


def test_a_refused_first_request_is_answered_403_and_a_stalled_head_is_cut(loopside: Loopside) -> None:
    """A first request naming another host gets a readable 403 from the loop; a later head begun
    and never finished is refused at its deadline (message_timeout_s, 1 s) while other connections
    are served; both are recorded."""
    refused = loopside.connect(WEB)
    stalling = loopside.connect(WEB)
    try:
        refused.sendall(b"GET / HTTP/1.1\r\nHost: evil.example.test\r\n\r\n")
        answer = b""
        while chunk := refused.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 403 Forbidden") and b"X-ADL-Enforcer-Rule: net.host_mismatch" in answer
        stalling.sendall(b"GET / HTTP/1.1\r\nHost: web.example.test\r\n\r\n")
        assert read_answer(stalling).startswith(b"HTTP/1.1 200 OK")
        stalling.sendall(b"GET /next HTTP/1.1\r\nHost: web.exa")
        started = time.monotonic()
        with loopside.connect(GOOD) as quick:
            assert ping(quick) == b"PONG\n"
        assert time.monotonic() - started < 0.5
        with contextlib.suppress(ConnectionResetError):
            assert stalling.recv(4096) == b""
        assert 0.5 < time.monotonic() - started < 3
    finally:
        refused.close()
        stalling.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    denials = {r["rules"][0]: r for r in records(loopside) if r.get("decision") == "deny"}
    assert set(denials) == {"net.host_mismatch", "net.unreadable"}
    assert "incomplete HTTP request head after 1 s" in denials["net.unreadable"]["reasons"][0]["text"]
    assert denials["net.unreadable"]["request"] == 2


def test_a_client_streaming_requests_gets_a_bounded_share_of_each_step() -> None:
    """An agent that keeps the filter's socket full of requests: one step of its connection reads
    a bounded share (READS_PER_STEP reads) and returns to the loop, which comes back while the
    socket stays readable; every request still goes through, each checked."""
    from enforcer.egress.sniff import parse_head
    from enforcer.egress.stream import READ_SIZE, READS_PER_STEP, ClientReader, Outbound

    agent, filter_side = socket.socketpair()
    upstream, server = socket.socketpair()
    pad = b"x" * (READ_SIZE - 100)
    heads = [b"GET /%d HTTP/1.1\r\nHost: web.example.test\r\nX-Pad: %s\r\n\r\n" % (n, pad) for n in range(48)]
    received: list[bytes] = []
    draining = threading.Thread(target=lambda: received.extend(iter(lambda: server.recv(1 << 20), b"")))
    draining.start()
    agent.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, 4 << 20)  # all of it waits in the socket at once
    agent.sendall(b"".join(heads[1:]))  # the first was sniffed
    checked: list[str] = []
    try:
        for sock in (filter_side, upstream):
            sock.setblocking(False)
        first = parse_head(heads[0])
        assert first is not None
        reader = ClientReader(filter_side)
        reader.buffer += heads[0]
        reader.take(first.size)

        def check(head: Any) -> None:
            checked.append(head.target)

        out = Outbound(reader, upstream, first, check, 5.0)
        steps = 0
        while out.requests < len(heads) and steps < 1000:
            before = out.requests
            out.step()
            assert out.requests - before <= READS_PER_STEP + 1  # a head a read (and the sniffed one): a share
            steps += 1
            time.sleep(0.001)
        assert out.requests == len(heads) and steps > 2 and out.refusal is None
        assert checked == [f"/{n}" for n in range(1, len(heads))]
    finally:
        for sock in (agent, filter_side, upstream):
            sock.close()
        draining.join(5)
        server.close()
    assert b"".join(received) == b"".join(heads)  # already canonical: forwarded as sent


def test_the_explicit_proxy_is_served_on_the_loop(loopside: Loopside) -> None:
    """CONNECT through the filter's listener, read and answered on the loop: an allowed host is
    tunnelled and what follows is decided as a captured connection's first message; a host not
    allowed and a request that is no CONNECT get a 403; no pool thread is taken for any of them."""
    with loopside.connect(GOOD) as warm:
        assert ping(warm) == b"PONG\n"  # starts the loop and resolves the name
    tunnelled = loopside.connect(PROXY)
    try:
        tunnelled.sendall(b"CONNECT api.example.test:443 HTTP/1.1\r\nHost: api.example.test:443\r\n\r\nPING\n")
        got = b""
        while not got.endswith(b"PONG\n"):
            chunk = tunnelled.recv(4096)
            assert chunk, got
            got += chunk
        assert got == b"HTTP/1.1 200 Connection Established\r\n\r\nPONG\n"
        answers = []
        for request in (
            b"CONNECT evil.example.test:443 HTTP/1.1\r\nHost: evil.example.test:443\r\n\r\n",
            b"GET http://api.example.test/ HTTP/1.1\r\nHost: api.example.test\r\n\r\n",
        ):
            with loopside.connect(PROXY) as refused:
                refused.sendall(request)
                answer = b""
                while chunk := refused.recv(4096):
                    answer += chunk
                answers.append(answer)
        pool = len(loopside.setup.workers._threads)  # type: ignore[attr-defined]
        assert pool <= 2, f"{pool} filter threads"
    finally:
        tunnelled.close()
    assert answers[0].startswith(b"HTTP/1.1 403") and b"X-ADL-Enforcer-Rule: net.host_not_allowed" in answers[0]
    assert answers[1].startswith(b"HTTP/1.1 403") and b"X-ADL-Enforcer-Rule: net.proxy_request" in answers[1]
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    connects = [r for r in records(loopside) if r["kind"] == "net.connect" and r.get("via") == "connect"]
    assert [(r["decision"], r["rules"][0]) for r in connects] == [
        ("allow", "net.allowed"),
        ("deny", "net.host_not_allowed"),
        ("deny", "net.proxy_request"),
    ]
    assert connects[0]["host"] == GOOD and connects[0]["destination"] == "api.example.test:443"


def test_a_client_that_waits_for_the_server_is_checked_when_it_speaks(loopside: Loopside) -> None:
    """Clients silent past sniff_timeout_s are relayed on the loop as server-speaks-first ones, but
    whatever they send first, however late, is read whole and checked before any of it goes
    upstream: a late HTTP request naming another host is refused and never reaches the server; a
    late allowed one goes through and the connection's later heads are checked too."""
    with loopside.connect(WEB) as warm:  # starts the loop and resolves the name
        warm.sendall(b"GET / HTTP/1.1\r\nHost: web.example.test\r\n\r\n")
        assert read_answer(warm).startswith(b"HTTP/1.1 200 OK")
    fronting = loopside.connect(WEB)
    patient = loopside.connect(WEB)
    try:
        time.sleep(0.3)  # past sniff_timeout_s (0.1 s): both decided as waiting for the server
        fronting.sendall(b"GET /x HTTP/1.1\r\nHost: evil.example.test\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert fronting.recv(4096) == b""
        patient.sendall(b"GET /late HTTP/1.1\r\nHost: web.example.test\r\n\r\n")
        assert read_answer(patient).startswith(b"HTTP/1.1 200 OK")
        patient.sendall(b"GET /later HTTP/1.1\r\nHost: evil.example.test\r\n\r\n")
        with contextlib.suppress(ConnectionResetError):
            assert patient.recv(4096) == b""
        pool = len(loopside.setup.workers._threads)  # type: ignore[attr-defined]
        assert pool <= 2, f"{pool} filter threads"
    finally:
        fronting.close()
        patient.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    web: HttpUpstream = loopside.web  # type: ignore[attr-defined]
    wait_for(lambda: len(web.received) == 3)
    assert b"evil" not in b"".join(web.received) and b"GET /late HTTP/1.1" in b"".join(web.received)
    denials = sorted((r["request"], r["http_host"]) for r in records(loopside) if r.get("decision") == "deny")
    assert denials == [(1, "evil.example.test"), (2, "evil.example.test")]


def test_a_first_message_cut_short_is_refused_with_why_early_or_late(loopside: Loopside) -> None:
    """The agent ends or stalls its first message, read at once or after it was silent past
    sniff_timeout_s: each connection is refused, recorded with how its first message ended."""
    hello_start = bytes([0x16, 0x03, 0x01, 0x02, 0x00]) + b"\x01\x00"  # a ClientHello's first bytes
    with loopside.connect(GOOD) as warm:
        assert ping(warm) == b"PONG\n"  # starts the loop (and resolves the name once)
    loopside.connect(GOOD).close()
    with loopside.connect(GOOD) as half:
        half.sendall(hello_start)
        half.shutdown(socket.SHUT_WR)
        with contextlib.suppress(ConnectionResetError):
            assert half.recv(1) == b""
    late_cut, late_stalled = loopside.connect(GOOD), loopside.connect(GOOD)
    try:
        time.sleep(0.3)  # past sniff_timeout_s (0.1 s): both decided as waiting for the server
        late_cut.sendall(hello_start)
        late_cut.shutdown(socket.SHUT_WR)
        late_stalled.sendall(hello_start)
        for sock in (late_cut, late_stalled):  # message_timeout_s (1 s) for the stalled one
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
    finally:
        late_cut.close()
        late_stalled.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    texts = sorted(r["reasons"][0]["text"] for r in records(loopside) if r.get("decision") == "deny")
    assert texts == [
        "client went away before sending anything (closed)",
        "client went away mid-message (closed)",
        "client went away mid-message (closed)",
        "incomplete TLS ClientHello after 1 s (7 bytes)",
    ]
