"""The egress filter's hand-over of TCP accepting to its pool, under connections the agent times.

The filter accepts a session's first TCP connection itself; from then on its pool accepts (lead()),
and serve() stops watching the TCP listeners. An agent whose namespace has IPv6 has two TCP
listeners: its first two connections, one to an IPv4 and one to an IPv6 destination sent at once,
are both ready in serve()'s first wait. The second must not make serve() hand over again (which
failed on listeners no longer watched and ended the filter, and would leave a second accepting
thread that no stop wakes).
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer.egress.netns import AgentNamespace

from ..unit.test_egress_process import ExhaustedListener, RecordingListener, Setup, audit_records, wait_for


@pytest.fixture
def setup(schemas: Any, tmp_path: Path) -> Iterator[Setup]:
    made = Setup(schemas, tmp_path)
    yield made
    made.close()


def test_first_connections_ready_on_two_listeners_at_once_keep_the_filter_serving(setup: Setup) -> None:
    listeners = [RecordingListener(), RecordingListener()]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=listeners, dns_udp=[], dns_tcp=[], ipv6=True)
    clients = [socket.create_connection(listener.getsockname()) for listener in listeners]  # queued before serve()
    failure: list[BaseException] = []
    result: dict[str, Any] = {}

    def serve() -> None:
        try:
            result["dropped"] = setup.server.serve(theirs, space)
        except BaseException as exc:
            failure.append(exc)

    serving = threading.Thread(target=serve)
    serving.start()
    try:
        wait_for(lambda: sum(len(listener.accepted_on) for listener in listeners) == 2 or not serving.is_alive())
        assert not failure, f"serve() ended: {failure[0]!r}"
        for listener in listeners:  # later connections, on either listener, are still taken
            clients.append(socket.create_connection(listener.getsockname()))
        wait_for(lambda: sum(len(listener.accepted_on) for listener in listeners) == 4)
        wait_for(lambda: setup.server.handlers.value == 0)
        ours.send(b"stop {}")
        serving.join(5)
        assert not serving.is_alive() and not failure
        summary = setup.server.stop(result["dropped"])
        late = socket.create_connection(listeners[0].getsockname())  # no accepting thread is left
        clients.append(late)
        wait_for(lambda: setup.server.handlers.value == 0)
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, *listeners, *clients):
            sock.close()
    assert sum(len(listener.accepted_on) for listener in listeners) == 4
    assert summary["connections"]["connections"] == 4
    setup.writer.sync()
    records = audit_records(setup.log)
    assert [r["payload"]["rules"] for r in records[:4]] == [["net.not_captured"]] * 4
    assert records[4]["intent"] == "adl.enforcer.net.summary"


def test_the_pause_out_of_descriptors_works_with_descriptors_past_1024(setup: Setup) -> None:
    """The agent holds DNS-over-TCP connections open before its first TCP connection, so the
    accepting thread's wake pipe gets a descriptor number past 1024; then it runs the filter out of
    descriptors. The pause before the next accept must not need select(2), which refuses such a
    number (the filter ended)."""
    held = [os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC) for _ in range(1100)]
    listener = ExhaustedListener()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=[listener], dns_udp=[], dns_tcp=[], ipv6=False)
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            setup.server.serve(theirs, space)
        except BaseException as exc:
            failure.append(exc)

    serving = threading.Thread(target=serve)
    clients: list[socket.socket] = []
    try:
        serving.start()
        clients.append(socket.create_connection(listener.getsockname()))  # loads the filter: the pool accepts next
        wait_for(lambda: len(listener.accepted_on) == 1 and setup.server.handlers.value == 0)
        assert setup.server._wake is not None and setup.server._wake[0] >= 1024
        listener.exhausted = True
        clients.append(socket.create_connection(listener.getsockname()))
        wait_for(lambda: listener.failed >= 2 or not serving.is_alive())
        assert not failure, f"serve() ended: {failure[0]!r}"
        listener.exhausted = False
        wait_for(lambda: len(listener.accepted_on) == 2)
        ours.send(b"stop {}")
        serving.join(5)
        assert not serving.is_alive() and not failure
        setup.server.stop({})
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, listener, *clients):
            sock.close()
        for fd in held:
            os.close(fd)


def test_a_first_tcp_connection_while_out_of_descriptors_does_not_end_the_filter(setup: Setup) -> None:
    """The agent runs the filter out of descriptors (DNS-over-TCP connections held open) before its
    first TCP connection: the hand-over to the pool, which needs a pipe, waits for a descriptor
    instead of ending the filter; the connection is taken once one is free."""
    listener = RecordingListener()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=[listener], dns_udp=[], dns_tcp=[], ipv6=False)
    client = socket.socket()
    setup.server._opened()  # loaded by the DNS-over-TCP connections, as serve() would have
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held: list[int] = []
    failure: list[BaseException] = []

    def serve() -> None:
        try:
            setup.server.serve(theirs, space)
        except BaseException as exc:
            failure.append(exc)

    serving = threading.Thread(target=serve)
    try:
        serving.start()
        time.sleep(0.1)  # serve() waits on its selector, whose descriptor it has
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, hard))
        with contextlib.suppress(OSError):
            while True:
                held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
        os.close(held.pop())  # one for the accepted connection: then none for the pipe
        client.connect(listener.getsockname())
        wait_for(lambda: len(listener.accepted_on) == 1 or not serving.is_alive())
        time.sleep(0.2)
        assert not failure, f"serve() ended: {failure[0]!r}"
        for fd in held:
            os.close(fd)
        held.clear()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        later = socket.create_connection(listener.getsockname())  # serve() hands over now
        wait_for(lambda: len(listener.accepted_on) == 2 and setup.server._wake is not None)
        later.close()
        ours.send(b"stop {}")
        serving.join(5)
        assert not serving.is_alive() and not failure
        setup.server.stop({})
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, listener, client):
            sock.close()
