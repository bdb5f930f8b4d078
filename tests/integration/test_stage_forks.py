"""The processes a launch forks (enforcer/sandbox/stage.py, pidns.py): init starts the future agent
without waiting for the stage's exit, and no process of the launch loads a libc handle of its own."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import AuditWriter
from enforcer.sandbox import pidns

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root
PR_SET_CHILD_SUBREAPER = 36


def test_init_starts_the_future_agent_while_the_stage_is_still_exiting() -> None:
    """The stage lingers after it announced init (a slow teardown of its memory): pid 2 is forked
    and running before the stage is gone."""
    pidns.LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # init is adopted here, as by a launcher
    ready_read, ready_write = os.pipe()
    status_read, status_write = os.pipe()
    stage = os.fork()
    if stage == 0:
        try:
            os.close(ready_read)
            os.close(status_read)
            announce = pidns.announce

            def lingering(fd: int, pid: int) -> None:
                announce(fd, pid)
                time.sleep(3)

            pidns.announce = lingering  # type: ignore[assignment]
            pidns.fork_init(status_write)
            os.write(ready_write, b"2")  # pid 2 only: the stage exits inside fork_init
        finally:
            os._exit(0)
    os.close(ready_write)
    os.close(status_write)
    init = None
    try:
        init = pidns.read_pid(status_read)
        readable, _, _ = select.select([ready_read], [], [], 2.0)
        assert readable and os.read(ready_read, 1) == b"2"
        assert os.waitpid(stage, os.WNOHANG) == (0, 0)  # the stage has not exited yet
    finally:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(stage, 0)
        if init is not None:  # pid 2 exited: init reports it and exits
            with contextlib.suppress(ChildProcessError):
                os.waitpid(init, 0)
            assert pidns.read_status(status_read) == 0
        os.close(ready_read)
        os.close(status_read)


def test_a_launch_loads_no_libc_handle_of_its_own(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stage, init, the future agent and the creation guard share the handle loaded with their
    modules: a new one costs each process a ctypes type of its own."""
    from enforcer.documents import load_policy
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.sandbox.stage import new_session_id, prepare
    from enforcer.session import host_features

    created = sandbox.ws / "created.txt"
    policy = load_policy(sandbox.policy())
    plan = build_plan(
        policy,
        ["python3", "-c", f"open({str(created)!r}, 'w')"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )
    assert plan.creation_denied is not None  # the guard is part of this launch
    real = ctypes.CDLL

    def no_new_libc(name: Any, *args: Any, **kw: Any) -> Any:
        if name is None:
            raise AssertionError("a libc handle loaded on the launch path")
        return real(name, *args, **kw)

    monkeypatch.setattr(ctypes, "CDLL", no_new_libc)
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    session = new_session_id()
    outcome = sandbox.run_session(
        policy, plan, writer, session, prepare(session, cgroup_group=sandbox.group), kernel_audit=False
    )
    assert (outcome.reason, outcome.exit_code) == ("exit", 0) and created.exists()


def test_the_order_goes_to_the_future_agent_while_the_stage_is_still_exiting(
    sandbox: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The launcher hands pid 2 its order without waiting for the stage's exit, and collects the
    stage later: no zombie is left."""
    from enforcer.documents import load_policy
    from enforcer.sandbox.plan import build_plan, load_baseline
    from enforcer.sandbox.stage import new_session_id, prepare
    from enforcer.session import host_features

    announce = pidns.announce

    def lingering(fd: int, pid: int) -> None:
        announce(fd, pid)
        if pid != os.getpid():  # the stage, having forked init: a slow exit
            time.sleep(2)

    monkeypatch.setattr(pidns, "announce", lingering)  # the stage is forked with it
    policy = load_policy(sandbox.policy())
    plan = build_plan(
        policy,
        ["python3", "-c", "pass"],
        baseline=load_baseline(Path(__file__).resolve().parents[2] / "policies" / "runtime-baseline.yaml"),
        environ={},
        features=host_features(),
    )
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", source="test")
    session = new_session_id()
    prepared = prepare(session, cgroup_group=sandbox.group)
    stage_pid = prepared.stage.pid
    send = prepared.stage.send
    at_order: list[tuple[int, int]] = []

    def sent(*args: Any) -> None:
        send(*args)
        at_order.append(os.waitpid(stage_pid, os.WNOHANG))

    monkeypatch.setattr(prepared.stage, "send", sent)
    outcome = sandbox.run_session(policy, plan, writer, session, prepared, kernel_audit=False)
    assert (outcome.reason, outcome.exit_code) == ("exit", 0)
    assert at_order == [(0, 0)]  # sent while the stage was still there
    with pytest.raises(ChildProcessError):
        os.waitpid(stage_pid, os.WNOHANG)  # collected by the launch
