"""Daemon sessions prepared before their order, attacked at the hand-over: an order sent to a
prepared supervisor that has just seen its stage die (its future agent killed before any order,
by the OOM killer or an operator) must never be lost unrecorded: either the supervisor takes it
(its launch then refuses and records the session) or the spawner sees the hand-over fail and
forks a supervisor of its own."""

from __future__ import annotations

import os
import select
import signal
import socket
from types import SimpleNamespace
from typing import Any

import pytest

from enforcer.daemon import spawner
from enforcer.sandbox import stage

from ..unit.test_spawner_prepared import an_order


def _read_within(fd: int, seconds: float) -> bytes:
    if not select.select([fd], [], [], seconds)[0]:
        return b""
    return os.read(fd, 1)


def test_an_order_sent_as_its_prepared_supervisor_gives_up_is_taken_or_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stage_gone_r, stage_gone_w = os.pipe()  # readable: the stage's order socket at its end
    ending_r, ending_w = os.pipe()  # the supervisor is on its way out, its order never read
    hold_r, hold_w = os.pipe()  # ... and stays there until the order was sent
    took_r, took_w = os.pipe()  # the supervisor went on with the order

    class GoneStage:
        def wait_announced(self) -> None:
            return None

        def fileno(self) -> int:
            return stage_gone_r

    class Ahead:
        stage = GoneStage()

        def discard(self) -> None:
            os.write(ending_w, b"e")
            os.read(hold_r, 1)

    def took(*_args: Any, **_kwargs: Any) -> int:
        os.write(took_w, b"t")
        return 0

    monkeypatch.setattr(stage, "prepare", lambda *_args, **_kwargs: Ahead())
    monkeypatch.setattr(spawner, "_supervise", took)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            code = spawner._await_order(theirs, SimpleNamespace(cgroup_group="unused"))  # type: ignore[arg-type]
        finally:
            os._exit(code)
    theirs.close()
    supervisor = pid
    ours.settimeout(spawner.HAND_OVER_S)
    sessions = spawner._Sessions(guardian=None)
    sessions.pidfds[pid] = os.pidfd_open(pid)
    sessions.waiting.append(spawner._Waiting(pid, ours))
    r, w = os.pipe()
    try:
        os.write(stage_gone_w, b"x")  # its stage dies before any order
        assert _read_within(ending_r, 10) == b"e"
        handed_to = spawner._hand_over(sessions, an_order("s-gone-stage"), [r, w, r, w], [], (None, "none"))
        os.write(hold_w, b"h")
        os.waitpid(pid, 0)
        pid = 0
        taken = _read_within(took_r, 0) == b"t"
        # Handed over only if taken; otherwise the spawner forks a supervisor of its own for it.
        assert (handed_to == supervisor) == taken, (handed_to, taken)
        assert handed_to is None and supervisor in sessions.retired
    finally:
        if pid:  # not collected yet
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(sessions.pidfds.pop(supervisor))
        for fd in (r, w, stage_gone_r, stage_gone_w, ending_r, ending_w, hold_r, hold_w, took_r, took_w):
            os.close(fd)
