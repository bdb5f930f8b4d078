"""The launch stage (enforcer/sandbox/stage.py) killed at each point of its short life (SIGKILL by
root or the OOM killer): before it forks the session's init, after the fork but before it announces
init, and after the announcement; and init killed right after it was announced. Whatever the point,
the launcher's reads and waits on the stage end: the launch fails with LaunchError (or, with the
stage killed after its announcement, runs), and init and pid 2 do not outlive it. A stage killed
between init's fork and its announcement used to leave the launcher reading the status pipe for
good: init held its write end.

Each launch runs in a child process of the test (the launcher, a child subreaper as adl-exec is),
so that a launch that never ends is bounded and killed; the kill points are hooks on the functions
the stage calls, set in that child before it forks the stage."""

from __future__ import annotations

import contextlib
import os
import select
import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer.sandbox import pidns

from ..helpers.processes import alive, until
from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root
BASELINE = Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"
BOUND_S = 20.0


def _kill_stage_at(point: str, report: int) -> None:
    """In the launcher, before the stage is forked: the stage SIGKILLs itself at `point`, having
    written init's host pid (when there is one) on `report`."""
    fork_init, announce = pidns.fork_init, pidns.announce

    def before_fork(*args: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)
        return fork_init(*args)

    def announcing(fd: int, pid: int) -> None:
        if pid == os.getpid():  # the stage announcing itself (no namespace): not a kill point
            announce(fd, pid)
            return
        os.write(report, f"{pid}\n".encode())
        if point in ("announced", "init-killed"):
            announce(fd, pid)
        if point == "init-killed":  # the OOM killer's choice: init, before pid 2 took its order
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(os.getpid(), signal.SIGKILL)

    if point == "before-fork":
        pidns.fork_init = before_fork  # type: ignore[assignment]
    else:
        pidns.announce = announcing  # type: ignore[assignment]


@contextlib.contextmanager
def _in_launcher(work: Callable[[], str], point: str) -> Iterator[tuple[str, list[int]]]:
    """Run `work` in a child (the launcher) with the stage's kill point set; yields its answer (or
    "hung"), and the host pids of the inits the stage forked, which are killed afterwards."""
    answer_read, answer_write = os.pipe()
    report_read, report_write = os.pipe()
    launcher = os.fork()
    if launcher == 0:
        code = 1
        try:
            os.close(answer_read)
            os.close(report_read)
            _kill_stage_at(point, report_write)
            try:
                answer = work()
            except BaseException as exc:  # reported, not raised into pytest's copy of itself
                answer = f"{type(exc).__name__}: {exc}"
            os.write(answer_write, answer.encode()[:4000])
            code = 0
        finally:
            os._exit(code)
    os.close(answer_write)
    os.close(report_write)
    answer = "hung"
    try:
        if select.select([answer_read], [], [], BOUND_S)[0]:
            answer = os.read(answer_read, 4096).decode()
    finally:
        if answer == "hung":
            os.kill(launcher, signal.SIGKILL)  # init's parent-death signal then ends the session
        os.waitpid(launcher, 0)
        reported = os.read(report_read, 4096) if select.select([report_read], [], [], 0)[0] else b""
        inits = [int(line) for line in reported.split()]
        os.close(answer_read)
        os.close(report_read)
    try:
        yield answer, inits
    finally:
        for init in inits:
            with contextlib.suppress(ProcessLookupError):
                os.kill(init, signal.SIGKILL)


def _plan(sandbox: Sandbox, marker: Path) -> Any:
    from enforcer.documents import load_policy
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.session import host_features

    return build_plan(
        load_policy(sandbox.policy()),
        ["python3", "-c", f"open({str(marker)!r}, 'w')"],
        baseline=load_baseline(BASELINE),
        environ={},
        features=host_features(),
    )


def _launch(sandbox: Sandbox, marker: Path, ahead: bool) -> Callable[[], str]:
    def work() -> str:
        from enforcer.sandbox import launcher
        from enforcer.sandbox.stage import new_session_id, prepare

        plan = _plan(sandbox, marker)
        session = new_session_id()
        prepared = prepare(session, cgroup_group=sandbox.group) if ahead else None
        try:
            outcome = launcher.run(plan, session, prepared=prepared, cgroup_group=sandbox.group, uid=65534, gid=65534)
        finally:
            if prepared is not None:
                prepared.discard()
        return f"ran: {outcome.reason} {outcome.exit_code}"

    return work


def _assert_gone(inits: list[int]) -> None:
    for init in inits:  # pid 2 goes with init: the kernel kills the rest of its PID namespace
        assert until(lambda init=init: not alive(init), 10), f"the session's init {init} outlived the launch"


@pytest.mark.parametrize("ahead", [False, True], ids=["per-order-stage", "stage-forked-ahead"])
@pytest.mark.parametrize("point", ["before-fork", "forked", "announced", "init-killed"])
def test_an_embedded_launch_ends_whenever_its_stage_is_killed(sandbox: Sandbox, point: str, ahead: bool) -> None:
    marker = sandbox.ws / "ran"
    with _in_launcher(_launch(sandbox, marker, ahead), point) as (answer, inits):
        assert answer != "hung", "the launch never ended"
        if point == "announced":  # init was handed over: the session goes on without the stage
            assert answer == "ran: exit 0", answer
            assert marker.exists()
        else:  # with init killed, pid 2 goes with it: before it announced itself or took the order
            assert answer.startswith("LaunchError: sandbox setup failed in the child: the launch stage is gone"), answer
            assert not marker.exists()
        assert len(inits) == (0 if point == "before-fork" else 1)
        _assert_gone(inits)


@pytest.mark.parametrize("point", ["before-fork", "forked"])
def test_a_daemon_prepared_stage_killed_before_it_announced_init_is_seen_gone(point: str) -> None:
    """The daemon's prepared supervisors wait for their stage's announcements before they take an
    order (spawner._await_order): a stage killed before it announced init is reported gone."""

    def work() -> str:
        from enforcer.sandbox.stage import StageError, prepare

        prepared = prepare("prepared", made_by_parent=(None, None), join_later=True)
        try:
            try:
                prepared.stage.wait_announced()
            except StageError as exc:
                failed = f"StageError: {exc}"
            else:
                return "announced"
            # An order handed over meanwhile is still taken (spawner._await_order): it must meet
            # the stage's end too, never reach a pid 2 that outlived it.
            try:
                prepared.stage.send(None, None, None)  # type: ignore[arg-type]
            except StageError:
                return failed
            return "an order went to a stage found gone"
        finally:
            prepared.discard()

    with _in_launcher(work, point) as (answer, inits):
        assert answer.startswith("StageError: the launch stage is gone before"), answer
        assert len(inits) == (0 if point == "before-fork" else 1)
        _assert_gone(inits)
