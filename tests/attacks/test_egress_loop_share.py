"""The connection loop under an agent whose bytes are cheap to send and dear to move: plain-HTTP
connections streaming thousands of tiny chunks, or of tiny pipelined requests, per segment. Each
is a few sends and parses for the filter, all of it on the one loop that serves every connection
of the session, so one step of such a connection must move a bounded share and come back for the
rest (the rest may already be read, where no readiness brings the loop back)."""

from __future__ import annotations

import contextlib
import os
import random
import resource
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from enforcer.egress import relay

from ..unit.test_egress_process import wait_for
from .test_egress_loop import GOOD, PORT, STALLED, WEB, Loopside, loopside, ping, records  # noqa: F401


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
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    starved = loopside.connect(GOOD)
    try:
        wait_for(lambda: loopside.setup.server.handlers.value == 1)  # accepted: it waits for its first bytes
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        os.close(held.pop())  # one left: the upstream socket's
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
    summary = loopside.stop()
    assert summary["connections"] == {**summary["connections"], "connections": 3, "allowed": 2, "denied": 1}
    written = records(loopside)
    connects = [r for r in written if r["kind"] == "net.connect"]
    assert [r["decision"] for r in connects] == ["allow", "deny", "allow"]
    assert connects[1]["host"] == GOOD and "Too many open files" in connects[1]["reasons"][0]["text"]
    assert len([r for r in written if r["kind"] == "net.close"]) == 2
