"""Daemon sessions prepared before their order, attacked at the hand-over: an order sent to a
prepared supervisor whose stage has just failed (its stage or future agent killed before any
order, by the OOM killer or an operator) must never be lost unrecorded: either the supervisor
takes it (its launch then refuses and records the session) or the spawner sees the hand-over
fail and forks a supervisor of its own."""

from __future__ import annotations

import os
import select
import signal
import socket
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass
class Pipes:
    gone: tuple[int, int]  # readable: the stage's order socket at its end
    held: tuple[int, int]  # the supervisor is held where the test wants it
    release: tuple[int, int]  # ... until the order was sent
    took: tuple[int, int]  # the supervisor went on with the order

    def close(self) -> None:
        for pair in (self.gone, self.held, self.release, self.took):
            for fd in pair:
                os.close(fd)


@pytest.fixture
def pipes() -> Iterator[Pipes]:
    made = Pipes(os.pipe(), os.pipe(), os.pipe(), os.pipe())
    yield made
    made.close()


def _hold(pipes: Pipes) -> None:
    os.write(pipes.held[1], b"h")
    os.read(pipes.release[0], 1)


def _fake_stage(monkeypatch: pytest.MonkeyPatch, pipes: Pipes, fail_announcing: bool) -> None:
    """A prepared stage that fails while it announces itself (held there first), or announces
    itself and then dies before any order (the supervisor held on its way out)."""

    class GoneStage:
        def wait_announced(self) -> None:
            if fail_announcing:
                _hold(pipes)
                raise stage.StageError("the launch stage is gone before it forked the session's init")

        def fileno(self) -> int:
            return pipes.gone[0]

    class Ahead:
        stage = GoneStage()

        def discard(self) -> None:
            if not fail_announcing:
                _hold(pipes)

    def took(*_args: Any, **_kwargs: Any) -> int:
        os.write(pipes.took[1], b"t")
        return 0

    monkeypatch.setattr(stage, "prepare", lambda *_args, **_kwargs: Ahead())
    monkeypatch.setattr(spawner, "_supervise", took)


def _hand_over_while_held(pipes: Pipes) -> tuple[int, int | None, bool]:
    """Fork a prepared supervisor, hand it an order while it is held, let it go on: its pid, what
    the hand-over returned, and whether the supervisor went on with the order."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            code = spawner._await_order(theirs, SimpleNamespace(cgroup_group="unused"), [])  # type: ignore[arg-type]
        finally:
            os._exit(code)
    theirs.close()
    ours.settimeout(spawner.HAND_OVER_S)
    sessions = spawner._Sessions(guardian=None)
    sessions.pidfds[pid] = os.pidfd_open(pid)
    sessions.waiting.append(spawner._Waiting(pid, ours))
    r, w = os.pipe()
    collected = False
    try:
        os.write(pipes.gone[1], b"x")  # its stage dies before any order
        assert _read_within(pipes.held[0], 10) == b"h"
        handed_to = spawner._hand_over(sessions, an_order("s-gone-stage"), [r, w, r, w], [], (None, "none"))
        os.write(pipes.release[1], b"r")
        os.waitpid(pid, 0)
        collected = True
        return pid, handed_to, _read_within(pipes.took[0], 0) == b"t"
    finally:
        if not collected:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(sessions.pidfds.pop(pid))
        for fd in (r, w):
            os.close(fd)


def test_an_order_sent_as_its_prepared_supervisor_gives_up_is_refused_by_the_hand_over(
    monkeypatch: pytest.MonkeyPatch, pipes: Pipes
) -> None:
    _fake_stage(monkeypatch, pipes, fail_announcing=False)
    pid, handed_to, taken = _hand_over_while_held(pipes)
    # Handed over only if taken; here it comes after the supervisor gave up: the spawner forks a
    # supervisor of its own for it.
    assert (handed_to == pid) == taken, (handed_to, taken)
    assert handed_to is None


def test_an_order_sent_while_a_prepared_stage_fails_to_announce_itself_is_taken(
    monkeypatch: pytest.MonkeyPatch, pipes: Pipes
) -> None:
    _fake_stage(monkeypatch, pipes, fail_announcing=True)
    pid, handed_to, taken = _hand_over_while_held(pipes)
    # Sent before the supervisor knew its stage had failed: it must take it (its launch then meets
    # the stage's end, and refuses and records the session).
    assert (handed_to == pid) == taken, (handed_to, taken)
    assert handed_to == pid
