"""The ends of the egress filter's connections at its stop: a connection accepted while the loop
ends, WebSocket relays on pool threads, and a log that stalls the loop. Whatever was accepted ends
with its records before net.summary (or is counted in it); nothing is relayed unrecorded.

No namespace: the test's clients reach the filter's listener on loopback directly (see
test_egress_loop.py)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit.registry import APPEND_LOCK
from enforcer.egress.loop import Loop

from ..unit.test_egress_process import Setup, audit_records
from .test_egress_loop import GOOD, STALLED, WEB, Loopside, Upstream, loopside, ping, records  # noqa: F401


def kinds(setup: Setup) -> list[dict[str, Any]]:
    setup.writer.sync()
    return [r["payload"] | {"kind": r["intent"].removeprefix("adl.enforcer.")} for r in audit_records(setup.log)]


def ended(sock: socket.socket, timeout: float = 5.0) -> bool:
    """Whether the filter closed (or reset) its side of `sock` within `timeout`."""
    sock.settimeout(timeout)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_work_posted_to_a_closed_loop_is_refused_not_dropped() -> None:
    loop = Loop(os.pipe2(os.O_CLOEXEC))
    ran: list[int] = []
    assert loop.post(lambda: ran.append(1))
    loop.run_once()
    assert ran == [1]
    loop.close()
    assert not loop.post(lambda: ran.append(2))
    assert ran == [1]


@pytest.mark.parametrize("ending", ["_stopping", "_quitting"])
def test_a_connection_accepted_as_the_loop_ends_is_closed_and_recorded_before_the_summary(
    schemas: Any, tmp_path: Path, ending: str
) -> None:
    """The first TCP connection starts the loop on a pool thread and is posted to it; the stop
    comes before the loop ran what was posted (the loop sees it stopping with no connection of
    its own, or told to quit, and ends). The connection is still closed, and recorded before
    net.summary."""
    setup = Setup(schemas, tmp_path)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    try:
        setattr(setup.server, ending, True)  # the launcher's stop, arriving as the loop starts
        setup.server.accept(listener, "tcp")
        summary = setup.server.stop({})
        assert ended(client), "the connection was left open"
        records = kinds(setup)
        order = [r["kind"] for r in records]
        assert "net.summary" in order
        before = order[: order.index("net.summary")]
        assert "net.connect" in before, order
        assert summary["connections"]["connections"] == 1
        assert summary["connections"]["denied"] + summary["connections"]["allowed"] == 1
        assert setup.server.handlers.value == 0
    finally:
        client.close()
        listener.close()
        setup.close()


def handshake(host: str) -> bytes:
    return (
        f"GET /chat HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


class Switching(Upstream):
    """Answers a WebSocket handshake with 101, then echoes until the client's end."""

    def _serve(self, conn: socket.socket) -> None:
        got = b""
        with conn, contextlib.suppress(OSError):
            conn.settimeout(30)
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                got += chunk
            conn.sendall(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
            while chunk := conn.recv(4096):
                conn.sendall(chunk)


def after_summary(side: Loopside) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The session's records before net.summary, and those after it."""
    written = records(side)
    at = [r["kind"] for r in written].index("net.summary")
    return written[:at], written[at + 1 :]


def test_many_websockets_open_at_stop_are_closed_and_recorded_before_the_summary(
    loopside: Loopside,  # noqa: F811
) -> None:
    """Twenty switched WebSocket relays, each on pool threads, open when the filter stops: each one
    is cut, and its net.connect, net.upgrade and net.close are written before net.summary."""
    switching = Switching()
    setup = loopside.setup
    setup.connections.resolver.zone[WEB] = [switching.address]  # type: ignore[attr-defined]
    setup.workers.shutdown()
    # Two pool threads a WebSocket (its handshake's and its way back's), as the filter's own pool allows.
    setup.workers = setup.connections.workers = ThreadPoolExecutor(max_workers=2 * 20 + 8)
    clients = []
    try:
        for _ in range(20):
            client = loopside.connect(WEB)
            client.sendall(handshake(WEB))
            assert client.recv(4096).startswith(b"HTTP/1.1 101")
            client.sendall(b"frame")
            assert client.recv(16) == b"frame"
            clients.append(client)
        summary = loopside.stop()
        before, after = after_summary(loopside)
        assert after == []
        closes = [r for r in before if r["kind"] == "net.close"]
        # what moved after the switch (the handshake and its answer are in net.upgrade)
        assert len(closes) == 20 and all((c["bytes_out"], c["bytes_in"]) == (5, 5) for c in closes), closes
        assert len([r for r in before if r["kind"] == "net.upgrade"]) == 20
        assert summary["connections"]["allowed"] == 20
        assert all(ended(client) for client in clients)
    finally:
        for client in clients:
            client.close()
        switching.close()


def test_a_websocket_still_dialling_at_stop_is_recorded_before_the_summary(loopside: Loopside) -> None:  # noqa: F811
    """A WebSocket handshake whose server never completes the TCP handshake: its pool thread is in
    the dial when the filter stops, and the stop's wait for it is shorter than the dial's limit. The
    stop records it (refused: not decided) before net.summary, and the dial ending later records
    nothing more."""
    loopside.setup.connections.connect_timeout_s = 2.0
    client = loopside.connect(STALLED)
    try:
        client.sendall(handshake(STALLED))
        time.sleep(0.3)  # the pool thread is dialling
        loopside.ours.send(b"stop {}")
        loopside.serving.join(10)
        started = time.monotonic()
        summary = loopside.setup.server.stop(loopside.result["dropped"], wait_s=0.5)
        assert time.monotonic() - started < 1.5
        loopside.summary = summary
        time.sleep(2.5)  # past the dial's limit: the pool thread has given up
        before, after = after_summary(loopside)
        assert after == [], after
        [refused] = [r for r in before if r["kind"] == "net.connect"]
        assert refused["decision"] == "deny" and refused["rules"] == ["net.filter_error"]
        assert summary["connections"]["denied"] == 1 and summary["unfinished_connections"] == 0
        assert ended(client)
    finally:
        client.close()


def test_a_stalled_log_holds_the_loop_but_nothing_moves_unrecorded(loopside: Loopside) -> None:  # noqa: F811
    """Another writer holds the log's append lease (a slow rotation, a stalled disk) while the agent
    opens a connection: its net.connect cannot be written, and none of its bytes may reach the server
    before it is. The loop writes records on its own thread, so a connection already relaying (one
    that needs no record) waits too, as long as the lease is held: the documented limit
    (docs/egress.md), measured here."""
    relaying = loopside.connect(GOOD)
    assert ping(relaying) == b"PONG\n"
    lease = os.open(loopside.setup.log / APPEND_LOCK, os.O_RDWR | os.O_CLOEXEC)
    held_s = 1.0
    try:
        fcntl.flock(lease, fcntl.LOCK_EX)
        taken = time.monotonic()
        newcomer = loopside.connect(GOOD)
        newcomer.sendall(b"PING\n")
        time.sleep(0.2)  # the loop has decided and dialled it, and waits to record it
        assert select.select([newcomer], [], [], 0)[0] == []  # its PING has not reached the server
        released: list[float] = []

        def release() -> None:
            released.append(time.monotonic())
            fcntl.flock(lease, fcntl.LOCK_UN)

        threading.Timer(held_s - (time.monotonic() - taken), release).start()
        sent = time.monotonic()
        relaying.sendall(b"echo")
        assert relaying.recv(16) == b"echo"
        stalled_s = time.monotonic() - sent
        print(f"\nrelaying connection stalled {stalled_s * 1000:.0f} ms behind a lease held {held_s * 1000:.0f} ms")
        assert released  # the echo came back only once the lease was given back
        assert newcomer.recv(16) == b"PONG\n"  # relayed once recorded
        allowed = [r for r in records(loopside) if r["kind"] == "net.connect" and r["decision"] == "allow"]
        assert len(allowed) == 2
        assert stalled_s <= held_s + 1.0  # bounded by the lease, not more
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(lease, fcntl.LOCK_UN)
        os.close(lease)
        relaying.close()
        with contextlib.suppress(NameError):
            newcomer.close()


def test_connections_arriving_during_the_stop_are_each_recorded_before_the_summary(
    loopside: Loopside,  # noqa: F811
) -> None:
    """The agent keeps opening connections (plain, and WebSocket handshakes to a server that never
    answers) while the filter stops: each one the filter took is closed and recorded before
    net.summary, the summary counts exactly those, and nothing is written after it."""
    silent = socket.create_server((loopside.upstream.address, 0))  # type: ignore[attr-defined]
    loopside.setup.connections.resolver.zone[WEB] = [loopside.upstream.address]  # type: ignore[attr-defined]
    opened: list[socket.socket] = []
    going = threading.Event()
    going.set()

    def flood() -> None:
        n = 0
        while going.is_set():
            with contextlib.suppress(OSError):
                sock = loopside.connect(GOOD if n % 2 else WEB)
                sock.sendall(b"PING\n" if n % 2 else handshake(WEB))
                opened.append(sock)
            n += 1

    flooding = threading.Thread(target=flood)
    flooding.start()
    try:
        time.sleep(0.3)
        summary = loopside.stop()
        going.clear()
        flooding.join(10)
        before, after = after_summary(loopside)
        assert after == []
        connects = [r for r in before if r["kind"] == "net.connect"]
        ids = {r["connection"] for r in connects}
        counted = summary["connections"]
        assert counted["connections"] == len(ids) == counted["allowed"] + counted["denied"], (counted, len(ids))
        allowed = {r["connection"] for r in connects if r["decision"] == "allow"}
        closed = {r["connection"] for r in before if r["kind"] == "net.close"}
        assert allowed == closed
        assert summary["unfinished_connections"] == 0 and loopside.setup.server.handlers.value == 0
        assert len(opened) > 10
    finally:
        going.clear()
        flooding.join(10)
        for sock in opened:
            sock.close()
        silent.close()


def test_a_log_stalled_at_the_stop_leaves_no_record_after_the_summary(loopside: Loopside) -> None:  # noqa: F811
    """WebSocket relays and a relayed connection open when the filter stops, with the log's append
    lease held by another writer past the stop's waits: the stop goes on once the lease is back,
    and every allowed connection has its net.close before net.summary or is counted unfinished in
    it; nothing is written after it."""
    switching = Switching()
    loopside.setup.connections.resolver.zone[WEB] = [switching.address]  # type: ignore[attr-defined]
    clients = []
    lease = os.open(loopside.setup.log / APPEND_LOCK, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(3):
            client = loopside.connect(WEB)
            client.sendall(handshake(WEB))
            assert client.recv(4096).startswith(b"HTTP/1.1 101")
            clients.append(client)
        plain = loopside.connect(GOOD)
        clients.append(plain)
        assert ping(plain) == b"PONG\n"
        loopside.setup.writer.sync()
        fcntl.flock(lease, fcntl.LOCK_EX)
        threading.Timer(1.5, fcntl.flock, (lease, fcntl.LOCK_UN)).start()
        loopside.ours.send(b"stop {}")
        loopside.serving.join(10)
        summary = loopside.setup.server.stop(loopside.result["dropped"], wait_s=0.3)
        loopside.summary = summary
        time.sleep(0.5)  # a thread that was still writing has written by now
        before, after = after_summary(loopside)
        assert after == []
        allowed = {r["connection"] for r in before if r["kind"] == "net.connect" and r["decision"] == "allow"}
        closed = {r["connection"] for r in before if r["kind"] == "net.close"}
        assert len(allowed) == 4 and closed <= allowed
        assert len(allowed - closed) <= summary["unfinished_connections"], (allowed, closed, summary)
        assert all(ended(client) for client in clients)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(lease, fcntl.LOCK_UN)
        os.close(lease)
        for client in clients:
            client.close()
        switching.close()


def test_a_wake_that_comes_while_the_loop_reads_its_wakes_is_not_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread pokes the loop just as the loop empties its wake pipe: the byte is read in the
    same drain. The loop must not be left believing a wake is pending with an empty pipe, or every
    later poke (the stop's among them) writes nothing and the loop sleeps for good."""
    loop = Loop(os.pipe2(os.O_CLOEXEC))
    read = os.read
    poked_during_drain: list[int] = []

    def reading(fd: int, size: int) -> bytes:
        if fd == loop._wake[0] and not poked_during_drain:
            poked_during_drain.append(1)
            loop.poke()  # another thread's, at this moment
        return read(fd, size)

    ran: list[int] = []
    try:
        loop.poke()
        monkeypatch.setattr(os, "read", reading)
        loop.run_once()  # the wake: its drain reads both pokes' bytes
        monkeypatch.undo()
        assert poked_during_drain
        loop.post(lambda: ran.append(1))
        running = threading.Thread(target=loop.run_once, daemon=True)
        running.start()
        running.join(2)
        assert ran == [1], "the posted work never ran: its wake was lost"
    finally:
        if not ran:
            loop._poked.clear()
            loop.poke()  # free the waiting thread before the loop is closed
            running.join(2)
        loop.close()
