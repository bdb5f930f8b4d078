"""Daemon sessions prepared before their order (spawner.py, SpawnerConfig.prepared_sessions): the
supervisor, its stage's init and the future agent are forked while no launch is asked for, an
order takes one of them, and another is prepared after it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from enforcer.sandbox import cgroups
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import cmdline, gone, ready, spawner_of, until, waiting

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def listed(daemon: RunningDaemon) -> pb.SessionInfo:
    """The one running session, once the spawner has reported its supervisor."""

    def sessions() -> list[pb.SessionInfo]:
        return list(daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions)

    assert until(lambda: len(sessions()) == 1 and sessions()[0].pid > 0, 10), sessions()
    (info,) = sessions()
    return info


def sleeping(daemon: RunningDaemon, session_file: Path) -> subprocess.Popen[str]:
    client = subprocess.Popen(
        daemon.exec_argv(
            "python3",
            "-c",
            "import os, time; print(os.getpid(), flush=True); time.sleep(60)",
            options=("--session-file", str(session_file)),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert client.stdout is not None and client.stdout.readline(), client.stderr.read() if client.stderr else ""
    return client


def test_an_order_takes_a_prepared_supervisor_whose_processes_join_its_session(daemon: RunningDaemon) -> None:
    before = ready(daemon)
    session_file = daemon.box.ws / "prepared-session.json"
    client = sleeping(daemon, session_file)
    try:
        session = json.loads(session_file.read_text())["session"]
        info = listed(daemon)
        assert info.session == session and info.pid in before, (info.pid, before)
        (init,) = before[info.pid]
        # The session's cgroup holds init and the agent, forked before the order, and nothing else;
        # the sessions' group holds no prepared session.
        assert sorted(cgroups.existing(group=daemon.group)) == [session]
        group = cgroups.existing(group=daemon.group)[session]
        members = group.members()
        agents = [p for p in members if b"time.sleep(60)" in cmdline(p)]
        assert init in members and len(agents) == 1 and len(members) >= 2, members
        # Another is prepared once the order has passed; none is the one in use.
        assert until(lambda: len(waiting(daemon)) == 2, 15), waiting(daemon)
        assert info.pid not in waiting(daemon)
        assert daemon.admin_stub().TerminateSession(pb.TerminateSessionRequest(session=session)).terminated
        client.wait(timeout=20)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    launches = [r for r in daemon.records() if r["corr"] == session and r["intent"].endswith(".launch")]
    assert len(launches) == 1


def test_each_order_takes_a_prepared_supervisor_never_used_before(daemon: RunningDaemon) -> None:
    used: list[int] = []
    for round in range(3):
        before = ready(daemon)
        assert not set(before) & set(used), (before, used)
        session_file = daemon.box.ws / f"prepared-{round}.json"
        client = sleeping(daemon, session_file)
        try:
            session = json.loads(session_file.read_text())["session"]
            info = listed(daemon)
            assert info.session == session and info.pid in before, (info.pid, before)
            used.append(info.pid)
            assert daemon.admin_stub().TerminateSession(pb.TerminateSessionRequest(session=session)).terminated
            client.wait(timeout=20)
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
    assert until(lambda: not daemon.sessions_left(), 10), daemon.sessions_left()


def test_a_prepared_supervisor_or_its_stage_killed_before_any_order_is_replaced(daemon: RunningDaemon) -> None:
    before = ready(daemon)
    supervisor, stage_init = sorted(before.items())[0][0], sorted(before.items())[1][1][0]
    initial = before[supervisor][0]
    os.kill(supervisor, signal.SIGKILL)
    os.kill(stage_init, signal.SIGKILL)  # the other one's init: its supervisor sees its stage gone
    assert until(lambda: gone(initial), 5), "a prepared init outlived its supervisor"
    after = ready(daemon)
    assert not set(after) & set(before), (before, after)
    for pid in [p for pids in before.values() for p in pids] + list(before):
        assert until(lambda pid=pid: gone(pid), 5), pid
    assert daemon.adl_exec("python3", "-c", "pass").returncode == 0


def test_no_prepared_process_outlives_the_daemon(daemon: RunningDaemon) -> None:
    prepared = ready(daemon)
    spawner = spawner_of(daemon)
    pids = [spawner, *prepared, *(p for inits in prepared.values() for p in inits)]
    daemon.stop()
    for pid in pids:
        assert until(lambda pid=pid: gone(pid), 5), (pid, cmdline(pid))
    for name in (daemon.group, daemon.group + ".helpers"):
        assert cgroups.existing(group=name) == {}


def test_with_none_prepared_each_order_forks_its_own_supervisor(daemon: RunningDaemon) -> None:
    daemon.stop()
    daemon.extra_env["ADL_ENFORCER_PREPARED_SESSIONS"] = "0"
    daemon.start()
    time.sleep(0.5)
    assert waiting(daemon) == {}
    result = daemon.adl_exec("python3", "-c", "pass")
    assert result.returncode == 0, result.stderr
    assert waiting(daemon) == {}


JOIN_SCRIPT = """
import json, sys, time
from enforcer.sandbox import cgroups
from enforcer.sandbox.stage import prepare
group = cgroups.create("session-join", group=sys.argv[1])
prepared = prepare("prepared", made_by_parent=(None, None), join_later=True)
prepared.stage.wait_announced()
time.sleep(0.2)
before = group.members()
prepared.stage.join(group.join_files())
deadline = time.monotonic() + 10
while len(group.members()) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
after = group.members()
print(json.dumps({"before": before, "after": after, "init": prepared.stage.pid, "agent": prepared.stage.agent_pid}))
prepared.discard()
group.remove(timeout=5)
"""


def test_a_prepared_stage_joins_no_cgroup_until_named_then_moves_init_and_itself() -> None:
    import sys
    import uuid

    name = f"adl-test-join-{uuid.uuid4().hex[:8]}"
    try:
        result = subprocess.run([sys.executable, "-c", JOIN_SCRIPT, name], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        seen = json.loads(result.stdout)
        assert seen["before"] == []
        assert sorted(seen["after"]) == sorted([seen["init"], seen["agent"]]), seen
    finally:
        for group in cgroups.existing(group=name).values():
            group.remove(timeout=5)
        for base in cgroups.group_directories(group=name):
            if base.is_dir():
                base.rmdir()
