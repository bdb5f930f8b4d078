"""The connection loop under an agent whose bytes are cheap to send and dear to move: plain-HTTP
connections streaming thousands of tiny chunks, or of tiny pipelined requests, per segment. Each
is a few sends and parses for the filter, all of it on the one loop that serves every connection
of the session, so one step of such a connection must move a bounded share and come back for the
rest (the rest may already be read, where no readiness brings the loop back)."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from enforcer.egress import relay

from ..unit.test_egress import client_hello
from ..unit.test_egress_process import wait_for
from .test_egress_loop import GOOD, PORT, PROXY, STALLED, WEB, Loopside, _pool_cpu, loopside, ping, records, starve_one  # noqa: F401


class Sink:
    """A server on a loopback address of its own that reads and counts whatever it is sent, and
    closes when the client has ended."""

    def __init__(self) -> None:
        self.address = f"127.{random.randint(1, 254)}.{random.randint(1, 254)}.{random.randint(2, 254)}"
        self.listener = socket.create_server((self.address, PORT), backlog=16)
        self.received = 0
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    def _drain(self, conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while got := conn.recv(1 << 20):
                self.received += len(got)
            conn.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for conn in self.conns:
            conn.close()


@pytest.fixture
def sink(loopside: Loopside) -> Iterator[Sink]:  # noqa: F811
    made = Sink()
    loopside.setup.connections.resolver.zone[WEB] = [made.address]  # type: ignore[attr-defined]
    try:
        yield made
    finally:
        made.close()


VOLUME = 240_000  # per stream: sent at once, it waits in the sockets' buffers for the filter


def _stream(sock: socket.socket, unit: bytes) -> None:
    with contextlib.suppress(OSError):
        sock.sendall(unit * (VOLUME // len(unit)))


def test_tiny_chunks_and_pipelined_requests_do_not_stall_the_loop(loopside: Loopside, sink: Sink) -> None:  # noqa: F811
    """Two connections send 1-byte chunks and one 40-byte requests, thousands at once: while the
    filter works through them, a new connection is still relayed at once; every byte of the
    streams reaches the server, and each is recorded when it ends."""
    with loopside.connect(GOOD) as warm:
        assert ping(warm) == b"PONG\n"  # starts the loop and resolves the name
    chunked = b"POST / HTTP/1.1\r\nHost: web.example.test\r\nTransfer-Encoding: chunked\r\n\r\n"
    request = b"GET / HTTP/1.1\r\nHost: web.example.test\r\n\r\n"
    streams = [(chunked, b"1\r\nx\r\n"), (chunked, b"1\r\nx\r\n"), (request, request)]
    agents: list[socket.socket] = []
    threads: list[threading.Thread] = []
    worst = 0.0
    try:
        for first, unit in streams:
            agent = loopside.connect(WEB)
            agent.sendall(first)
            agents.append(agent)
            threads.append(threading.Thread(target=_stream, args=(agent, unit), daemon=True))
            threads[-1].start()
        wait_for(lambda: sink.received > 10_000)
        for _ in range(8):
            started = time.monotonic()
            with loopside.connect(GOOD) as quick:
                assert ping(quick) == b"PONG\n"
            worst = max(worst, time.monotonic() - started)
        for thread in threads:
            thread.join(10)
        for agent in agents:
            agent.shutdown(socket.SHUT_WR)
        wait_for(lambda: loopside.setup.server.handlers.value == 0, timeout=60)
    finally:
        for agent in agents:
            agent.close()
    assert worst < 0.5, f"a new connection waited {worst:.2f} s behind the streams"
    sent = sum(len(first) + VOLUME // len(unit) * len(unit) for first, unit in streams)
    assert sink.received == sent
    summary = loopside.stop()
    assert summary["connections"] == {**summary["connections"], "connections": 12, "allowed": 12, "denied": 0}
    closing = [r for r in records(loopside) if r["kind"] == "net.close" and r["host"] == WEB]
    assert len(closing) == 3 and all(r["requests"] >= 1 for r in closing)


def test_connections_the_stop_does_not_wait_for_are_still_recorded(loopside: Loopside) -> None:  # noqa: F811
    """The launcher stops the filter while a connection is being dialled (an upstream that never
    answers the handshake, with a dial timeout longer than the stop waits) and another is relayed
    and stays open: the stop ends both, and each is recorded and counted in the summary, before it."""
    loopside.setup.connections.connect_timeout_s = 30.0
    relayed = loopside.connect(GOOD)
    assert ping(relayed) == b"PONG\n"
    dialling = loopside.connect(STALLED)
    try:
        dialling.sendall(b"PING\n")
        flows = loopside.setup.connections.flows
        wait_for(lambda: any(flow.upstream is not None for flow in flows if flow.host == STALLED))  # dialling
        summary = loopside.stop()
    finally:
        relayed.close()
        dialling.close()
    written = records(loopside)
    assert [r["kind"] for r in written][-1] == "net.summary"
    connects = [r for r in written if r["kind"] == "net.connect"]
    assert sorted((r.get("host"), r["decision"]) for r in connects) == [(GOOD, "allow"), (STALLED, "deny")]
    assert [r["host"] for r in written if r["kind"] == "net.close"] == [GOOD]
    assert summary["connections"] == {**summary["connections"], "connections": 2, "allowed": 1, "denied": 1}


def test_no_descriptor_to_relay_with_is_refused_before_it_is_recorded_allowed(loopside: Loopside) -> None:  # noqa: F811
    """The agent's connections leave the filter one descriptor: its upstream socket is made and
    dialled, but no pipe can be had to relay through. The connection is refused with one record,
    never recorded as allowed and then refused; the loop serves on once descriptors are free."""
    first = loopside.connect(GOOD)
    assert ping(first) == b"PONG\n"
    first.close()
    upstream = loopside.upstream  # type: ignore[attr-defined]
    wait_for(lambda: loopside.setup.server.handlers.value == 0 and len(upstream.received) == 1)
    with relay._kept_lock:  # no kept pipe: the relay needs new ones
        kept, relay._kept[:] = list(relay._kept), []
    for pair in kept:
        for end in pair:
            os.close(end)
    summary = starve_one(loopside, spare=1)  # one left: the upstream socket's
    assert summary["connections"] == {**summary["connections"], "connections": 3, "allowed": 2, "denied": 1}
    written = records(loopside)
    connects = [r for r in written if r["kind"] == "net.connect"]
    assert [r["decision"] for r in connects] == ["allow", "deny", "allow"]
    assert connects[1]["host"] == GOOD and "Too many open files" in connects[1]["reasons"][0]["text"]
    assert len([r for r in written if r["kind"] == "net.close"]) == 2


EVIL = b"evil.example.test"
GOOD_HEAD = b"GET /1 HTTP/1.1\r\nHost: web.example.test\r\n\r\n"
EVIL_HEAD = b"GET /2 HTTP/1.1\r\nHost: evil.example.test\r\n\r\n"
CONNECT_WEB = b"CONNECT web.example.test:443 HTTP/1.1\r\nHost: web.example.test:443\r\n\r\n"


@pytest.mark.parametrize(
    ("via", "segments"),
    [
        pytest.param(WEB, [GOOD_HEAD + EVIL_HEAD], id="pipelined-in-the-first-segment"),
        pytest.param(WEB, [GOOD_HEAD, EVIL_HEAD[:-1], EVIL_HEAD[-1:]], id="later-head-split-before-its-last-lf"),
        pytest.param(WEB, [GOOD_HEAD + EVIL_HEAD[:24], EVIL_HEAD[24:]], id="later-head-split-in-its-host"),
        pytest.param(
            WEB,
            [b"POST /1 HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: 5\r\n\r\nhello" + EVIL_HEAD],
            id="after-a-body-in-the-same-segment",
        ),
        pytest.param(
            WEB,
            [
                b"POST /1 HTTP/1.1\r\nHost: web.example.test\r\nTransfer-Encoding: chunked\r\n\r\n"
                + b"5\r\nhello\r\n0\r\n\r\n"
                + EVIL_HEAD
            ],
            id="after-a-chunked-body-in-the-same-segment",
        ),
        pytest.param(
            WEB,
            [b"GET /1 HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: %d\r\n\r\n" % len(EVIL_HEAD) + EVIL_HEAD],
            id="as-the-content-of-a-get",
        ),
        pytest.param(WEB, [EVIL_HEAD, GOOD_HEAD], id="after-a-refused-first-request"),
        pytest.param(WEB, [None, EVIL_HEAD], id="late-http-from-a-silent-client"),
        pytest.param(WEB, [None, "hello"], id="late-tls-from-a-silent-client"),
        pytest.param(PROXY, [CONNECT_WEB + EVIL_HEAD], id="proxy-tunnel-then-http-in-one-segment"),
        pytest.param(PROXY, [CONNECT_WEB, "hello"], id="proxy-tunnel-then-tls"),
        pytest.param(PROXY, [CONNECT_WEB + GOOD_HEAD + EVIL_HEAD], id="proxy-tunnel-then-pipelined-http"),
    ],
)
def test_no_other_host_reaches_the_server_however_the_bytes_come(
    loopside: Loopside,  # noqa: F811
    via: str,
    segments: list[bytes | str | None],
) -> None:
    """The agent names another host after, behind or around what the filter allowed, on the loop
    (pipelined, split at awkward places, after a body, late, through the proxy): that name never
    reaches the server, and its refusal is recorded."""
    agent = loopside.connect(via)
    try:
        for segment in segments:
            if segment is None:
                time.sleep(0.3)  # past sniff_timeout_s: decided as waiting for the server
            elif segment == "hello":
                agent.sendall(client_hello(EVIL.decode()))
            else:
                agent.sendall(segment)
            time.sleep(0.05)
        agent.settimeout(3)
        with contextlib.suppress(ConnectionResetError):
            while agent.recv(65536):
                pass
    finally:
        agent.close()
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    web = loopside.web  # type: ignore[attr-defined]
    assert EVIL not in b"".join(web.received)
    refusals = [r for r in records(loopside) if r.get("decision") == "deny"]
    assert refusals and all(r["rules"][0] in ("net.host_mismatch", "net.unreadable") for r in refusals)


def test_a_refusal_while_an_answer_waits_for_the_agent_ends_the_connection(loopside: Loopside) -> None:  # noqa: F811
    """The agent does not read the answer to its first request (the filter holds some of it, its
    socket full) and sends a request naming another host: the refusal cuts both sides, and what
    the filter held can no longer be written. The connection must end there, recorded, and the
    loop must not spin on the cut socket."""
    with loopside.connect(GOOD) as warm:
        assert ping(warm) == b"PONG\n"  # starts the loop and resolves the name
    body = 8 << 20  # echoed back by the server: more than the sockets on the way back hold
    agent = socket.socket()
    agent.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    agent.bind(("127.0.0.1", 0))
    loopside.meant[agent.getsockname()[1]] = GOOD
    agent.connect(loopside.listener.getsockname())
    try:
        agent.sendall(b"POST / HTTP/1.1\r\nHost: api.example.test\r\nContent-Length: %d\r\n\r\n" % body)
        agent.sendall(b"x" * body)
        flows = loopside.setup.connections.flows
        wait_for(lambda: any(f.back is not None and f.back.in_pipe and f.out and f.out.state == "next" for f in flows))
        agent.sendall(b"GET / HTTP/1.1\r\nHost: evil.example.test\r\n\r\n")
        before = _pool_cpu(loopside)
        time.sleep(1)
        spent = _pool_cpu(loopside) - before
        ended = loopside.setup.server.handlers.value == 0
    finally:
        agent.close()
    assert ended and spent < 0.5, f"ended: {ended}, {spent:.2f} s of CPU in the second after the refusal"
    loopside.stop()
    written = records(loopside)
    [refused] = [r for r in written if r.get("decision") == "deny"]
    assert refused["rules"] == ["net.host_mismatch"] and refused["request"] == 2
    assert len([r for r in written if r["kind"] == "net.close"]) == 2


def test_an_urgent_byte_inside_a_request_body_neither_spins_nor_stops_the_loop(loopside: Loopside) -> None:  # noqa: F811
    """The agent sends an urgent byte in the middle of a request body (spliced on the loop): the
    loop does not spin on it, the body's bytes around it reach the server, and so does the next
    request."""
    agent = loopside.connect(WEB)
    try:
        agent.sendall(b"POST /1 HTTP/1.1\r\nHost: web.example.test\r\nContent-Length: 10\r\n\r\n01234")
        time.sleep(0.1)
        agent.send(b"!", socket.MSG_OOB)
        before = _pool_cpu(loopside)
        time.sleep(0.6)
        spent = _pool_cpu(loopside) - before
        agent.sendall(b"56789")
        agent.sendall(GOOD_HEAD)
        got = b""
        while got.count(b"ok") < 2:
            chunk = agent.recv(4096)
            assert chunk, got
            got += chunk
    finally:
        agent.close()
    assert spent < 0.2, f"{spent:.2f} s of CPU with an urgent byte pending"
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    loopside.stop()
    web = loopside.web  # type: ignore[attr-defined]
    wait_for(lambda: len(web.received) == 1)
    assert web.received[0].endswith(b"\r\n\r\n0123456789" + GOOD_HEAD)


def test_a_connection_the_loop_cannot_go_on_with_is_counted_refused_and_named(
    loopside: Loopside,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The agent's name is not in the filter's resolver cache and no thread can be had to resolve
    it (the helpers' pids limit): the connection is refused, and like every refusal it is counted
    as denied in the summary and its record names the host it was for."""
    with loopside.connect(GOOD) as warm:
        assert ping(warm) == b"PONG\n"  # starts the loop and resolves GOOD (not WEB)

    def no_thread(*args: object, **kwargs: object) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(loopside.setup.connections.workers, "submit", no_thread)
    with loopside.connect(WEB) as agent:
        agent.sendall(GOOD_HEAD)
        with contextlib.suppress(ConnectionResetError):
            assert agent.recv(4096) == b""
    wait_for(lambda: loopside.setup.server.handlers.value == 0)
    summary = loopside.stop()
    assert summary["connections"] == {**summary["connections"], "connections": 2, "allowed": 1, "denied": 1}
    [refused] = [r for r in records(loopside) if r.get("decision") == "deny"]
    assert refused["rules"] == ["net.filter_error"] and "no thread" in refused["reasons"][0]["text"]
    assert refused["host"] == WEB and refused["port"] == PORT


def test_a_clienthello_slower_than_the_first_byte_wait_is_read_whole_within_its_bound(loopside: Loopside) -> None:  # noqa: F811
    """A ClientHello whose first byte comes before the first-byte wait (0.1 s) and the rest after it,
    within the message's bound (1 s): the client is not taken for one waiting for the server; its
    name is read from the whole hello and decided."""
    hello = client_hello(GOOD, ["http/1.1"])
    with loopside.connect(GOOD) as agent:
        agent.sendall(hello[:1])
        time.sleep(0.3)
        agent.sendall(hello[1:])
        wait_for(lambda: any(r["kind"] == "net.connect" for r in records(loopside)))
    connects = [r for r in records(loopside) if r["kind"] == "net.connect"]
    assert [(r["decision"], r.get("host")) for r in connects] == [("allow", GOOD)]


def test_a_hello_in_one_byte_records_is_not_reparsed_per_byte_on_the_loop(
    loopside: Loopside,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ClientHello sent as 2,000 one-byte TLS records in small writes: the loop sniffs again only
    when the bytes read can change the answer, not once for every write."""
    from enforcer.egress import filter as connection_filter

    from ..unit.test_egress import records as split_records

    calls: list[int] = []
    real = connection_filter.sniff
    monkeypatch.setattr(connection_filter, "sniff", lambda data: calls.append(len(data)) or real(data))
    hello = split_records(client_hello(GOOD), [1] * 2000)
    chunks = [hello[i : i + 6] for i in range(0, len(hello), 6)]
    with loopside.connect(GOOD) as agent:
        for chunk in chunks:
            agent.sendall(chunk)
            time.sleep(0.0002)
        wait_for(lambda: any(r["kind"] == "net.connect" for r in records(loopside)))
    connects = [r for r in records(loopside) if r["kind"] == "net.connect"]
    assert [(r["decision"], r.get("host")) for r in connects] == [("allow", GOOD)]
    assert len(calls) < len(chunks) // 5, (len(calls), len(chunks))
