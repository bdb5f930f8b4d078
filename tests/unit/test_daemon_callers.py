"""Caller identity on the API socket (callers.py) and the approvals' separate bounds."""

from __future__ import annotations

import pytest

from enforcer.daemon.approvals import ApprovalError, Approvals
from enforcer.daemon.callers import ROOT, CallerTable
from enforcer.daemon.launch import Caller


def test_a_relayed_peer_names_its_caller_and_nothing_else_is_guessed() -> None:
    table = CallerTable()
    alice = Caller(pid=10, uid=1001, gid=1001, groups=(5,))
    number, name = table.add(alice)
    assert table.of(f"unix-abstract:{name}") == alice
    assert table.of(f"unix-abstract:{name}".encode()) == alice
    assert table.of("unix:") == ROOT  # an unnamed end on the root-only socket
    for forged in (
        "unix:/tmp/x",  # a caller's own bound path
        "unix-abstract:adl-enforcerd-000000000000-1",  # another instance's prefix
        f"unix-abstract:{table.prefix}x",
        f"unix-abstract:{table.prefix}{number + 1}",
        "ipv4:127.0.0.1:5",
        "",
    ):
        assert table.of(forged) is None, forged
    table.remove(number)
    assert table.of(f"unix-abstract:{name}") is None  # a closed connection's calls are refused
    assert table.connections_of(1001) == 0


def test_connection_numbers_are_not_predictable() -> None:
    table = CallerTable()
    numbers = [table.add(ROOT)[0] for _ in range(50)]
    assert len(set(numbers)) == 50 and sorted(numbers) != list(range(numbers[0], numbers[0] + 50))
    assert table.connections_of(0) == 50


def _open(approvals: Approvals, agent: str, uid: int | None) -> None:
    approvals.open(
        decision_id="d",
        agent=agent,
        session="",
        tool="t",
        arguments={},
        reasons=(),
        expires_ms=10_000,
        uid=uid,
    )


def test_pending_approvals_are_bounded_per_agent_per_uid_and_in_all() -> None:
    approvals = Approvals(lambda: 0, limit=10, per_agent=4, per_uid=3)
    for _ in range(4):
        _open(approvals, "flood", None)
    with pytest.raises(ApprovalError, match="agent 'flood'"):
        _open(approvals, "flood", None)
    for _ in range(3):
        _open(approvals, "other", 1001)
    with pytest.raises(ApprovalError, match="uid 1001"):
        _open(approvals, "third", 1001)
    _open(approvals, "third", 1002)  # another uid still has room
    _open(approvals, "fourth", None)
    _open(approvals, "fourth", None)
    with pytest.raises(ApprovalError, match="10 approvals"):
        _open(approvals, "fifth", None)
    first = approvals.pending("flood")[0]
    approvals.resolve(first.approval_id, "rejected", "me", "", lambda a: None)
    _open(approvals, "flood", None)  # a resolved approval frees its agent's place


def test_close_wakes_every_waiter_at_once() -> None:
    approvals = Approvals(lambda: 0)
    _open(approvals, "a", None)
    pending = approvals.pending()[0]
    approvals.close()
    assert approvals.wait(pending.approval_id, 30).outcome == "pending"  # returns at once, not in 30 s


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload


def test_the_request_clock_follows_http2_frames_split_anywhere() -> None:
    from enforcer.daemon.callers import RequestClock

    stream = (
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
        + _frame(0x4, 0, 0, b"s" * 6)  # SETTINGS
        + _frame(0x1, 0x4, 1, b"h" * 20)  # HEADERS: request 1 begins
        + _frame(0x1, 0x4, 3, b"h" * 9)  # request 3 begins
        + _frame(0x0, 0x1, 1, b"d" * 300)  # DATA with END_STREAM: request 1 is whole
        + _frame(0x1, 0x5, 5, b"h" * 4)  # HEADERS with END_STREAM: nothing left to wait for
    )
    for size in (1, 2, 7, 9, 64, len(stream)):
        clock = RequestClock()
        for i in range(0, len(stream), size):
            clock.feed(stream[i : i + size], 1.0)
        assert clock.open == {3: 1.0}, size
        assert not clock.late(5.0, 10.0) and clock.late(12.0, 10.0)
        clock.feed(_frame(0x3, 0, 3, b"\0" * 4), 2.0)  # RST_STREAM: the caller gave up
        assert clock.open == {}


def test_a_request_the_server_has_ended_is_not_waited_for() -> None:
    from enforcer.daemon.callers import RequestClock

    clock = RequestClock()
    clock.feed(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + _frame(0x1, 0x4, 1, b"h" * 20) + _frame(0x1, 0x4, 3), 1.0)
    server = _frame(0x4, 0, 0, b"s" * 12) + _frame(0x1, 0x4, 1, b"m" * 30) + _frame(0x1, 0x5, 1, b"t" * 9)
    for i in range(len(server)):  # split anywhere
        clock.feed_server(server[i : i + 1])
    assert clock.open == {3: 1.0}  # the server answered (and ended) stream 1; stream 3 still waits
    clock.feed_server(_frame(0x3, 0, 3, b"\0" * 4))
    assert clock.open == {}
