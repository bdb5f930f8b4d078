"""DNS messages an agent sends its namespace's stub that are not queries. Each one is refused
unanswered and recorded: nothing the agent sends the filter may go unaudited."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import Any

import dns.flags
import dns.message

from ..unit.test_egress_process import Setup, audit_records, query, udp_pair, wait_for


def a_response() -> bytes:
    """A well-formed DNS message with the QR bit set: a response, not a query."""
    message = dns.message.from_wire(query("api.example.test"))
    message.flags |= dns.flags.QR
    return message.to_wire()


def test_a_response_sent_as_a_query_is_recorded_over_udp_and_tcp(schemas: Any, tmp_path: Path) -> None:
    setup = Setup(schemas, tmp_path)
    server, client = udp_pair()
    try:
        with server, client:
            client.sendto(a_response(), server.getsockname())
            setup.server.udp_query(server)
            wait_for(lambda: setup.server.dns_stats["queries"] == 1)
        ours, theirs = socket.socketpair()
        with ours:
            wire = a_response()
            ours.sendall(struct.pack("!H", len(wire)) + wire)
            ours.shutdown(socket.SHUT_WR)
            setup.server.tcp_dns(theirs)
            assert ours.recv(2) == b""  # unanswered
        assert setup.server.dns_stats == {"queries": 2, "denied": 2, "shed": 0}
        setup.writer.sync()
        events = [r["payload"] for r in audit_records(setup.log)]
        assert [(e["decision"], e["rules"]) for e in events] == [("deny", ["net.dns_malformed"])] * 2
        assert all("not a query" in e["error"] for e in events)
    finally:
        setup.close()
