"""The spawner's prepared supervisors (spawner.py): an order goes to exactly one, once; one that does
not take it whole is killed and never tried again; one that ends before its order is replaced after
a pause that grows."""

from __future__ import annotations

import os
import pickle
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.daemon import spawner
from enforcer.daemon.orders import LaunchOrder, SpawnerConfig
from enforcer.egress_values import EgressValues
from enforcer.framing import recv_frame


def an_order(session: str) -> LaunchOrder:
    return LaunchOrder(
        session=session,
        agent="coder",
        adl={"name": "Coder"},
        aaif=None,
        policy_digest="sha256:00",
        argv=("/bin/true",),
        environ={},
        cwd="/",
        uid=1000,
        gid=1000,
        accept_unenforced=(),
        pids_max=64,
    )


def prepared(sessions: spawner._Sessions, pid: int) -> socket.socket:
    ours, theirs = socket.socketpair()
    sessions.waiting.append(spawner._Waiting(pid, ours))
    return theirs


def test_an_order_goes_to_the_oldest_prepared_supervisor_once_and_its_socket_is_closed() -> None:
    sessions = spawner._Sessions(guardian=None)
    first, second = prepared(sessions, 101), prepared(sessions, 102)
    r, w = os.pipe()
    try:
        for name, expected, peer in (("s-1", 101, first), ("s-2", 102, second)):
            assert spawner._hand_over(sessions, an_order(name), [r, w], ["/j"], (None, "none")) == expected
            frame = recv_frame(peer, max_fds=4)
            assert frame is not None
            data, fds = frame
            order_json, joins, group = pickle.loads(data)
            assert group == (None, "none")
            assert b'"' + name.encode() + b'"' in order_json and joins == ["/j"] and len(fds) == 2
            for fd in fds:
                os.close(fd)
            assert recv_frame(peer) is None  # nothing more ever comes: its socket is closed
        assert sessions.waiting == []
        assert spawner._hand_over(sessions, an_order("s-3"), [r, w], [], (None, "none")) is None
    finally:
        for fd in (r, w):
            os.close(fd)
        first.close()
        second.close()


def test_a_prepared_supervisor_that_cannot_take_its_order_is_killed_and_the_next_takes_it() -> None:
    sessions = spawner._Sessions(guardian=None)
    gone = prepared(sessions, 201)
    gone.close()  # its end is gone: the order cannot be sent
    victim = os.fork()
    if victim == 0:
        time.sleep(30)
        os._exit(0)
    sessions.waiting[0].pid = victim
    sessions.pidfds[victim] = os.pidfd_open(victim)
    taker = prepared(sessions, 202)
    r, w = os.pipe()
    try:
        assert spawner._hand_over(sessions, an_order("s-x"), [r, w], [], (None, "none")) == 202
        assert os.waitpid(victim, 0)[1] != 0  # killed
        assert sessions.retired == {victim} and sessions.waiting == []
        assert recv_frame(taker, max_fds=4) is not None
    finally:
        os.close(sessions.pidfds.pop(victim))
        for fd in (r, w):
            os.close(fd)
        taker.close()


def test_a_prepared_supervisor_that_ends_before_its_order_is_replaced_after_a_growing_pause(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sessions = spawner._Sessions(guardian=None)
    pauses = []
    for _ in range(10):
        now = time.monotonic()
        spawner._prepare_later(sessions, "test")
        pauses.append(round(sessions.prepare_at - now, 1))
    assert pauses[:4] == [0.5, 1.0, 2.0, 4.0] and pauses[-1] == 60.0
    assert "next is prepared in 60 s" in capsys.readouterr().err


def test_retired_supervisors_see_the_end_of_their_socket() -> None:
    sessions = spawner._Sessions(guardian=None)
    peers = [prepared(sessions, pid) for pid in (301, 302)]
    spawner._retire_waiting(sessions)
    assert sessions.waiting == [] and sessions.retired == {301, 302}
    for peer in peers:
        assert recv_frame(peer) is None
        peer.close()


def test_the_number_prepared_is_checked_with_the_spawner_configuration(tmp_path: Path) -> None:
    from enforcer.daemon.orders import OrderError

    members: dict[str, Any] = {
        "audit_dir": tmp_path,
        "audit_key": tmp_path / "k",
        "audit_group_ms": 5.0,
        "audit_group_records": 64,
        "production": False,
        "regions": tmp_path / "r",
        "baseline": tmp_path / "b",
        "cgroup_group": "g",
        "helper_memory_mb": 64,
        "egress": EgressValues(),
    }
    assert SpawnerConfig(**members).prepared_sessions == 0
    assert SpawnerConfig(**members, prepared_sessions=2).prepared_sessions == 2
    for wrong in (-1, 17, True, 1.0):
        with pytest.raises(OrderError, match="prepared_sessions"):
            SpawnerConfig(**members, prepared_sessions=wrong)


def test_a_stage_outside_its_own_pid_namespace_never_moves_pid_1(tmp_path: Path) -> None:
    """Pid "1" names the session's init only from pid 2 of the session's PID namespace; anywhere else
    it is the host's init (or another namespace's), which must never be moved into a session."""
    from enforcer.sandbox.stage import _join_with_init

    procs = tmp_path / "cgroup.procs"
    error = _join_with_init(os.fsencode(str(procs)))
    assert isinstance(error, OSError) and "pid 2" in str(error)
    assert not procs.exists()
