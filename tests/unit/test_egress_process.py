"""The egress filter process's serving parts without a namespace or root: its records in a temporary
audit log, DNS answers from the stub against an in-memory upstream (over UDP and TCP on loopback),
the connection accounting and the stop summary; what it loads after "ready", and from where."""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import dns.message
import dns.rcode
import orjson
import pytest

from enforcer.audit import AuditUnavailable, AuditWriter
from enforcer.audit.writer import log_files
from enforcer.command_start import trusted_import_path
from enforcer.egress.dns import DnsStub, Resolution, ResolveError, SyntheticAddresses, UpstreamResolver, dnspython
from enforcer.egress.filter import ConnectionFilter
from enforcer.egress.netns import AgentNamespace
from enforcer.egress.process import EgressProcess
from enforcer.egress.server import FilterServer, Recorder

from ..helpers.documents import base_adl, compile_doc

ZONE = {"api.example.test": ["203.0.113.5"]}


class ZoneUpstream(UpstreamResolver):
    """An upstream resolver answering from a dictionary instead of the network."""

    def __init__(self, zone: dict[str, list[str]]) -> None:
        super().__init__(("192.0.2.53", 53), 1.0)
        self.zone = zone

    def _query(self, name: str, version: int) -> tuple[Resolution, float]:
        if name not in self.zone:
            return Resolution(nxdomain=True), 5.0
        found = [ipaddress.ip_address(a) for a in self.zone[name] if ipaddress.ip_address(a).version == version]
        return Resolution(found), 30.0


def audit_records(directory: Path) -> list[dict[str, Any]]:
    lines = (line for path in log_files(directory) for line in path.read_bytes().splitlines())
    return [r for r in map(orjson.loads, lines) if r["intent"].startswith("adl.enforcer.net.")]


def query(name: str, qtype: str = "A") -> bytes:
    return dns.message.make_query(name, qtype).to_wire()


class Setup:
    def __init__(self, schemas: Any, tmp_path: Path, *, max_connections: int = 4, max_pending: int = 256) -> None:
        policy = compile_doc(
            schemas, base_adl(permissions={"network": {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}})
        )
        self.log = tmp_path / "log"
        self.writer = AuditWriter(self.log, tmp_path / "key.pem", source="adl-egress")
        self.record = Recorder(self.writer, "agent-1", "session-1")
        resolver, synthetic = ZoneUpstream(ZONE), SyntheticAddresses()
        self.workers = ThreadPoolExecutor(max_workers=8)
        self.connections = ConnectionFilter(
            policy,
            resolver,
            synthetic,
            self.record,
            listen_port=15001,
            workers=self.workers,
            connect_timeout_s=1.0,
            sniff_timeout_s=0.1,
            message_timeout_s=1.0,
        )
        self.opened = 0

        def open_connections() -> tuple[ConnectionFilter, ThreadPoolExecutor]:
            self.opened += 1
            return self.connections, self.workers

        self.server = FilterServer(
            self.record,
            DnsStub(policy, resolver, synthetic),
            open_connections,
            max_connections,
            max_pending=max_pending,
        )

    def close(self) -> None:
        self.workers.shutdown(wait=False, cancel_futures=True)
        if self.server._dns_pool is not None:
            self.server._dns_pool.shutdown(wait=False, cancel_futures=True)
        self.writer.close()


@pytest.fixture
def setup(schemas: Any, tmp_path: Path) -> Iterator[Setup]:
    made = Setup(schemas, tmp_path)
    yield made
    made.close()


def udp_pair() -> tuple[socket.socket, socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.settimeout(5)
    return server, client


def wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_records_name_the_agent_and_the_session_and_put_denials_first(setup: Setup) -> None:
    setup.record("net.dns", {"decision": "deny", "host": "evil.test"})
    setup.record("net.connect", {"decision": "allow", "host": "api.example.test"})
    setup.writer.sync()
    denied, allowed = audit_records(setup.log)
    assert denied["intent"] == "adl.enforcer.net.dns" and denied["corr"] == "session-1"
    assert denied["payload"] == {"agent": "agent-1", "decision": "deny", "host": "evil.test"}
    assert denied["priority"] == "high" and allowed["priority"] == "normal"
    assert allowed["from"] == "adl-egress"


def test_refusals_past_the_bound_are_counted_and_allowed_ones_always_written(setup: Setup) -> None:
    setup.record.max_detailed_denials = 3
    for i in range(7):
        setup.record("net.dns", {"decision": "deny", "rules": ["net.dns_name_not_allowed"], "host": f"x{i}.test"})
        setup.record("net.connect", {"decision": "allow", "host": "api.example.test"})
    setup.record("net.connect", {"decision": "deny", "rules": ["net.port_not_allowed"], "host": "api.example.test"})
    setup.writer.sync()
    written = audit_records(setup.log)
    kinds = [r["intent"].removeprefix("adl.enforcer.") for r in written]
    assert kinds.count("net.dns") == 3 and kinds.count("net.connect") == 7
    assert kinds.count("net.denials_counted") == 1
    assert kinds.index("net.denials_counted") > max(i for i, k in enumerate(kinds) if k == "net.dns")
    assert setup.record.counted() == {
        "total": 5,
        "by_rule": {"net.dns_name_not_allowed": 4, "net.port_not_allowed": 1},
    }


def test_answers_are_recorded_and_counted(setup: Setup) -> None:
    allowed = dns.message.from_wire(setup.server.answer(query("api.example.test")) or b"")
    assert allowed.rcode() == dns.rcode.NOERROR
    address = allowed.answer[0][0].address
    assert address != "203.0.113.5"  # the agent gets a synthetic address, never the real one
    denied = dns.message.from_wire(setup.server.answer(query("evil.test")) or b"")
    assert denied.rcode() == dns.rcode.NXDOMAIN
    assert setup.server.dns_stats == {"queries": 2, "denied": 1, "shed": 0}
    setup.writer.sync()
    events = [r["payload"] for r in audit_records(setup.log)]
    assert [(e["host"], e["decision"]) for e in events] == [("api.example.test", "allow"), ("evil.test", "deny")]


def test_an_answer_that_cannot_be_recorded_is_not_given(setup: Setup) -> None:
    setup.writer.close()
    assert setup.server.answer(query("api.example.test")) is None
    assert setup.server.dns_stats["queries"] == 1


def slot_free(server: FilterServer) -> bool:
    if not server._pending.acquire(blocking=False):
        return False
    server._pending.release()
    return True


def test_udp_queries_are_answered_from_the_pool(schemas: Any, tmp_path: Path) -> None:
    single = Setup(schemas, tmp_path, max_pending=1)
    server, client = udp_pair()
    try:
        with server, client:
            for _ in range(3):  # the one slot is given back after each answer
                client.sendto(query("api.example.test"), server.getsockname())
                single.server.udp_query(server)
                response = dns.message.from_wire(client.recv(65535))
                assert response.rcode() == dns.rcode.NOERROR and response.answer
                wait_for(lambda: slot_free(single.server))
            assert single.server.dns_stats == {"queries": 3, "denied": 0, "shed": 0}
    finally:
        single.close()


def test_udp_queries_past_the_pending_limit_are_shed_unanswered(schemas: Any, tmp_path: Path) -> None:
    flooded = Setup(schemas, tmp_path, max_pending=1)
    server, client = udp_pair()
    release = threading.Event()
    answer = flooded.server.answer

    def slow_answer(wire: bytes) -> bytes | None:
        release.wait(5)
        return answer(wire)

    flooded.server.answer = slow_answer  # type: ignore[method-assign]  # holds the one pending slot
    try:
        with server, client:
            for name in ("api.example.test", "second.example.test"):
                client.sendto(query(name), server.getsockname())
                flooded.server.udp_query(server)
            assert flooded.server.dns_stats["shed"] == 1
            release.set()
            assert dns.message.from_wire(client.recv(65535)).question[0].name.to_text() == "api.example.test."
            client.settimeout(0.3)
            with pytest.raises(TimeoutError):
                client.recv(65535)  # the shed query is never answered
    finally:
        release.set()
        flooded.close()


def test_dns_over_tcp_answers_each_query_until_the_client_closes(setup: Setup) -> None:
    client, conn = socket.socketpair()
    with client:
        done = threading.Thread(target=setup.server.tcp_dns, args=(conn,))
        done.start()
        for name in ("api.example.test", "evil.test"):
            wire = query(name)
            client.sendall(struct.pack("!H", len(wire)) + wire)
            size = struct.unpack("!H", client.recv(2))[0]
            response = b""
            while len(response) < size:
                response += client.recv(size - len(response))
            assert dns.message.from_wire(response).question[0].name.to_text() == name + "."
        client.shutdown(socket.SHUT_WR)
        done.join(5)
        assert not done.is_alive() and conn.fileno() == -1  # the handler closed its end
    assert setup.server.dns_stats == {"queries": 2, "denied": 1, "shed": 0}


def test_connections_past_the_limit_are_refused_and_audited(schemas: Any, tmp_path: Path) -> None:
    limited = Setup(schemas, tmp_path, max_connections=1)
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        first = socket.create_connection(listener.getsockname())
        limited.server.accept(listener, "dns_tcp")  # a DNS-over-TCP handler that waits for queries
        wait_for(lambda: limited.server.handlers.value == 1)
        second = socket.create_connection(listener.getsockname())
        second.settimeout(5)
        limited.server.accept(listener, "tcp")
        with pytest.raises(ConnectionResetError):  # reset unserved
            second.recv(1)
        assert limited.server.handlers.value == 1
        first.close()
        wait_for(lambda: limited.server.handlers.value == 0)  # a finished handler is counted out
        second.close()
        limited.writer.sync()
        refused = [r["payload"] for r in audit_records(limited.log)]
        assert [p["rules"] for p in refused] == [["net.too_many_connections"]]
        assert refused[0]["decision"] == "deny" and limited.connections.stats == {
            "connections": 1,
            "allowed": 0,
            "denied": 1,
            "bytes_out": 0,
            "bytes_in": 0,
        }
    finally:
        listener.close()
        limited.close()


def test_serve_until_stop_then_summarise(setup: Setup) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    udp, client = udp_pair()
    tcp = socket.create_server(("127.0.0.1", 0))
    space = AgentNamespace(netns_fd=-1, tcp=[tcp], dns_udp=[udp], dns_tcp=[], ipv6=False)
    result: dict[str, Any] = {}
    serving = threading.Thread(target=lambda: result.update(dropped=setup.server.serve(theirs, space)))
    serving.start()
    try:
        client.sendto(query("evil.test"), udp.getsockname())
        assert dns.message.from_wire(client.recv(65535)).rcode() == dns.rcode.NXDOMAIN
        ours.send(b"stop " + orjson.dumps({"udp": 3, "quic": 0}))
        serving.join(5)
        assert not serving.is_alive() and result["dropped"] == {"udp": 3, "quic": 0}
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, udp, client, tcp):
            sock.close()

    summary = setup.server.stop(result["dropped"])
    assert summary["dns"] == {"queries": 1, "denied": 1, "shed": 0}
    assert summary["dropped_packets"] == {"udp": 3, "quic": 0} and summary["connections"]["connections"] == 0
    setup.writer.sync()
    last = audit_records(setup.log)[-1]
    assert last["intent"] == "adl.enforcer.net.summary"
    assert last["payload"]["decision"] == "deny" and last["payload"]["rules"] == ["net.udp"]  # dropped packets


class RecordingListener(socket.socket):
    """A TCP listener that notes which thread accepted each connection."""

    def __init__(self) -> None:
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.accepted_on: list[int] = []
        self.bind(("127.0.0.1", 0))
        self.listen(16)

    def accept(self) -> tuple[socket.socket, Any]:
        accepted = super().accept()
        self.accepted_on.append(threading.get_ident())
        return accepted


def test_connections_after_the_first_are_accepted_by_the_thread_that_handles_them(setup: Setup) -> None:
    """Once the connection filter is loaded, each TCP connection is accepted on a pool thread that
    then handles it (no hand-off on the way to its checks); at stop no thread accepts any more, and
    every connection is in the records and totals before the summary."""
    handled_on: list[int] = []
    handle = setup.connections.handle

    def noting(conn: socket.socket) -> None:
        handled_on.append(threading.get_ident())
        handle(conn)

    setup.connections.handle = noting  # type: ignore[method-assign]
    listener = RecordingListener()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=[listener], dns_udp=[], dns_tcp=[], ipv6=False)
    result: dict[str, Any] = {}
    serving = threading.Thread(target=lambda: result.update(dropped=setup.server.serve(theirs, space)))
    serving.start()
    late = None
    try:
        for count in range(1, 5):
            with socket.create_connection(listener.getsockname()) as client:
                client.settimeout(5)
                with pytest.raises(ConnectionResetError):  # not redirected: no original destination
                    client.recv(1)
            wait_for(lambda: len(handled_on) == count and setup.server.handlers.value == 0)  # noqa: B023
        ours.send(b"stop {}")
        serving.join(5)
        summary = setup.server.stop(result["dropped"])
        late = socket.create_connection(listener.getsockname())
        time.sleep(0.3)
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, listener, *([late] if late else [])):
            sock.close()
    assert len(listener.accepted_on) == 4  # the late one was not accepted
    assert listener.accepted_on[0] == serving.ident != handled_on[0]  # the first: loads the filter, hands off
    assert listener.accepted_on[1:] == handled_on[1:] and serving.ident not in handled_on[1:]
    assert summary["connections"] == {**summary["connections"], "connections": 4, "denied": 4}
    setup.writer.sync()
    records = audit_records(setup.log)
    assert [r["payload"]["rules"] for r in records[:4]] == [["net.not_captured"]] * 4
    assert records[4]["intent"] == "adl.enforcer.net.summary" and len(records) == 5


class ExhaustedListener(RecordingListener):
    """A listener whose accept fails as in a process out of descriptors, until told otherwise."""

    def __init__(self) -> None:
        super().__init__()
        self.exhausted = False
        self.failed = 0

    def accept(self) -> tuple[socket.socket, Any]:
        if self.exhausted:
            self.failed += 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_serve_waits_instead_of_spinning_when_out_of_descriptors(setup: Setup) -> None:
    """The same for what serve() accepts itself (DNS over TCP, the first TCP connection)."""
    listener = ExhaustedListener()
    listener.exhausted = True
    try:
        started = time.monotonic()
        setup.server.accept(listener, "dns_tcp")
        assert time.monotonic() - started >= 0.04 and listener.failed == 1 and setup.server.handlers.value == 0
    finally:
        listener.close()


def test_the_accepting_thread_waits_instead_of_spinning_when_out_of_descriptors(setup: Setup) -> None:
    """Out of descriptors, the queued connection keeps the listener readable: the accepting thread
    tries again after a pause rather than in a busy loop, and accepts once it can."""
    listener = ExhaustedListener()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=[listener], dns_udp=[], dns_tcp=[], ipv6=False)
    serving = threading.Thread(target=lambda: setup.server.serve(theirs, space))
    serving.start()
    clients: list[socket.socket] = []
    try:
        clients.append(socket.create_connection(listener.getsockname()))  # loads the filter: the pool accepts next
        wait_for(lambda: len(listener.accepted_on) == 1 and setup.server.handlers.value == 0)
        listener.exhausted = True
        clients.append(socket.create_connection(listener.getsockname()))
        time.sleep(0.5)
        assert 2 <= listener.failed <= 20  # a pause between tries, not thousands of them
        listener.exhausted = False
        wait_for(lambda: len(listener.accepted_on) == 2)  # taken once descriptors are back
        ours.send(b"stop {}")
        serving.join(5)
        assert not serving.is_alive()
        setup.server.stop({})
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, listener, *clients):
            sock.close()


def test_a_refusal_the_accepting_thread_cannot_record_ends_the_serving(setup: Setup) -> None:
    """A connection the pool's accepting thread must refuse but cannot record makes serve() raise
    (the filter fails and its launcher is told), as it does when serve() accepts it itself; the
    connection is not left waiting unaccepted and unrecorded."""
    listener = RecordingListener()
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    space = AgentNamespace(netns_fd=-1, tcp=[listener], dns_udp=[], dns_tcp=[], ipv6=False)
    raised: list[BaseException] = []

    def serving_body() -> None:
        try:
            setup.server.serve(theirs, space)
        except BaseException as exc:
            raised.append(exc)

    serving = threading.Thread(target=serving_body)
    serving.start()
    try:
        with socket.create_connection(listener.getsockname()) as client:
            client.settimeout(5)
            with pytest.raises(ConnectionResetError):
                client.recv(1)
        wait_for(lambda: setup.server.handlers.value == 0 and len(listener.accepted_on) == 1)

        def unrecordable(conn: socket.socket, limit: int) -> None:
            conn.close()
            raise AuditUnavailable("the audit log is unwritable")

        setup.server.max_connections = 0
        setup.connections.refuse_over_limit = unrecordable  # type: ignore[method-assign]
        with socket.create_connection(listener.getsockname()):
            serving.join(5)
    finally:
        if serving.is_alive():
            ours.send(b"stop {}")
            serving.join(5)
        for sock in (ours, theirs, listener):
            sock.close()
    assert not serving.is_alive() and len(listener.accepted_on) == 2
    assert [type(exc) for exc in raised] == [AuditUnavailable]


def test_each_distinct_question_is_decided_once_and_the_kept_answers_are_bounded(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filter keeps decide()'s answers for its one policy: a repeated question is not decided
    again and gets the same answer; an agent that asks ever new questions cannot grow the memory."""
    from enforcer.egress import filter as connection_filter
    from enforcer.policy import NetworkConnect, decide

    asked: list[NetworkConnect] = []

    def counting(policy: Any, question: NetworkConnect) -> Any:
        asked.append(question)
        return decide(policy, question)

    monkeypatch.setattr(connection_filter, "decide", counting)
    monkeypatch.setattr(connection_filter, "MAX_KEPT_DECISIONS", 3)
    connections = setup.connections
    allowed = NetworkConnect("api.example.test", 443, "tls", "93.184.215.14")
    refused = NetworkConnect("api.example.test", 22, "tcp", "93.184.215.14")
    assert connections._decide(allowed) == decide(connections.policy, allowed) and asked == [allowed]
    assert connections._decide(allowed).allowed and asked == [allowed]  # kept
    assert not connections._decide(refused).allowed and asked == [allowed, refused]
    for port in range(1000, 1010):
        connections._decide(NetworkConnect("api.example.test", port, "tcp", "93.184.215.14"))
        assert len(connections._decisions) <= 3
    assert connections._decide(allowed).allowed and asked[-1] == allowed  # forgotten, decided again


def test_a_summary_without_drops_allows(setup: Setup) -> None:
    summary = setup.server.stop({"udp": 0, "error": "unreadable"})
    assert summary["dns"] == {"queries": 0, "denied": 0, "shed": 0}
    setup.writer.sync()
    payload = audit_records(setup.log)[-1]["payload"]
    assert payload["decision"] == "allow" and payload["rules"] == []


def test_without_dnspython_queries_go_unanswered_and_names_unresolved(
    setup: Setup, monkeypatch: pytest.MonkeyPatch
) -> None:
    """dnspython is loaded at first use, after the filter said ready: if it cannot be, nothing is
    answered or resolved, and every query is still recorded."""
    wire = query("api.example.test")
    dnspython.cache_clear()
    monkeypatch.setitem(sys.modules, "dns.message", None)  # importing it now raises ImportError
    try:
        assert setup.server.answer(wire) is None
        with pytest.raises(ResolveError, match="could not be loaded"):
            UpstreamResolver(("192.0.2.53", 53), 1.0).lookup("api.example.test", 4)
    finally:
        monkeypatch.undo()
        dnspython.cache_clear()
    assert setup.server.dns_stats == {"queries": 1, "denied": 1, "shed": 0}
    setup.writer.sync()
    [event] = [r["payload"] for r in audit_records(setup.log)]
    assert event["decision"] == "deny" and event["rules"] == ["net.dns_unavailable"]
    assert "import of dns.message halted" in event["error"]
    # Loadable again: the failure was not remembered.
    assert dns.message.from_wire(setup.server.answer(wire) or b"").rcode() == dns.rcode.NOERROR


def test_the_import_path_leaves_out_the_working_directory(tmp_path: Path) -> None:
    """What the filter imports after "ready" it imports while the agent runs: never from the
    directory `python -m` or `-c` put first, which the agent may write to."""
    work, lib = tmp_path / "work", tmp_path / "lib"
    work.mkdir()
    lib.mkdir()
    (tmp_path / "link").symlink_to(work)
    path = ["", "relative", str(work), f"{work}/", str(tmp_path / "link"), str(lib), sys.prefix]
    assert trusted_import_path(path, str(work)) == [str(lib), sys.prefix]


def test_a_filter_that_failed_after_ready_gives_its_error_as_the_summary() -> None:
    """The launcher learns why: the error the filter queued before it exited, even though its own
    "stop" can no longer be sent."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    theirs.send(b"error OSError: the audit log is unwritable")
    theirs.close()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    summary = EgressProcess(pid, os.open("/dev/null", os.O_RDONLY), ours).stop()
    assert summary == {"error": "the egress filter failed after it started: OSError: the audit log is unwritable"}


def test_the_connection_filter_is_made_at_the_first_connection(schemas: Any, tmp_path: Path) -> None:
    """A session that opens no connection never loads the connection filter or its threads; its
    summary still has every total."""
    idle = Setup(schemas, tmp_path)
    try:
        summary = idle.server.stop({})
        assert idle.opened == 0 and idle.server.connections is None and idle.server._dns_pool is None
        assert summary["connections"] == idle.connections.stats  # the same totals a filter starts with
    finally:
        idle.close()
    busy = Setup(schemas, tmp_path / "busy")
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        clients = [socket.create_connection(listener.getsockname()) for _ in range(2)]
        for _ in clients:
            busy.server.accept(listener, "dns_tcp")
        assert busy.opened == 1 and busy.server.connections is busy.connections  # made once
        for client in clients:
            client.close()
        wait_for(lambda: busy.server.handlers.value == 0)
    finally:
        listener.close()
        busy.close()


def test_the_filter_process_loads_its_serving_half_without_the_connection_filter() -> None:
    """What the filter's process imports before it serves anything (sys.modules of a fresh
    interpreter): neither the connection filter nor a thread pool nor dnspython."""
    code = (
        "import sys, json; import enforcer.egress.process, enforcer.egress.server; "
        "print(json.dumps(sorted(sys.modules)))"
    )
    modules = set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, check=True).stdout))
    assert "enforcer.egress.server" in modules
    loaded = {"enforcer.egress.filter", "enforcer.egress.sniff", "concurrent.futures", "dns"} & modules
    assert not loaded, loaded


def accept_one_reset(setup: Setup) -> None:
    """One client connects; the filter server accepts it and must reset it."""
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        client = socket.create_connection(listener.getsockname())
        client.settimeout(5)
        setup.server.accept(listener, "tcp")
        with pytest.raises(ConnectionResetError):
            client.recv(1)
        client.close()
    finally:
        listener.close()


def test_a_connection_filter_that_cannot_be_loaded_refuses_and_records(setup: Setup) -> None:
    def broken() -> tuple[ConnectionFilter, ThreadPoolExecutor]:
        raise ImportError("no module named 'enforcer.egress.filter'")

    setup.server._open_connections = broken
    accept_one_reset(setup)
    assert setup.server.connections is None and setup.server.handlers.value == 0
    setup.writer.sync()
    [refused] = [r["payload"] for r in audit_records(setup.log)]
    assert refused["decision"] == "deny" and refused["rules"] == ["net.filter_error"]
    assert "could not be loaded" in refused["reasons"][0]["text"]


def test_a_connection_without_a_thread_to_handle_it_is_refused_and_the_filter_serves_on(setup: Setup) -> None:
    """An agent that opens connections until the filter can start no more threads (its pids
    limit) gets those refused and recorded; the filter does not die with its summary unwritten."""

    class Exhausted(ThreadPoolExecutor):
        def submit(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("can't start new thread")

    connections, workers = setup.server._opened()
    workers.shutdown()
    setup.server.workers = Exhausted(max_workers=1)
    accept_one_reset(setup)
    assert setup.server.handlers.value == 0 and setup.server.connections is connections
    setup.writer.sync()
    [refused] = [r["payload"] for r in audit_records(setup.log)]
    assert refused["decision"] == "deny" and refused["rules"] == ["net.filter_error"]
    assert "no thread" in refused["reasons"][0]["text"]
