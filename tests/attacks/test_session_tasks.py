"""The unit sets no TasksMax (systemd/README.md): each session's agent and helpers have pids limits
of their own, but a caller may start as many sessions as its agent's max_concurrent allows (none
by default), each up to max_pids. Without a bound on all of them together, sessions at their own
limits take every pid of the host. The spawner bounds the sessions' groups together."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcer.daemon import spawner
from enforcer.daemon.orders import SpawnerConfig
from enforcer.egress_values import EgressValues
from enforcer.sandbox import cgroups

from ..helpers.daemon import RunningDaemon

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="cgroups need root"),
    pytest.mark.skipif(cgroups.detect() == "none", reason="no usable cgroup hierarchy"),
]

HOST_TASKS = 100  # as if the host had this many pids: the shares are then small enough to fill
FORKER = """
import os, sys, time
for procs in sys.argv[2:]:
    with open(procs, "w") as f:
        f.write(str(os.getpid()))
started = 0
for _ in range(int(sys.argv[1])):
    try:
        pid = os.fork()
    except BlockingIOError:
        break
    if pid == 0:
        time.sleep(120)
        os._exit(0)
    started += 1
print(started, flush=True)
time.sleep(120)
"""


def _config(group: str, tmp: Path) -> SpawnerConfig:
    return SpawnerConfig(
        audit_dir=tmp / "audit",
        audit_key=tmp / "key.pem",
        audit_group_ms=5.0,
        audit_group_records=64,
        production=False,
        regions=tmp / "regions.yaml",
        baseline=tmp / "baseline.yaml",
        cgroup_group=group,
        helper_memory_mb=64,
        egress=EgressValues(max_connections=8),
    )


@contextlib.contextmanager
def _sessions(config: SpawnerConfig) -> Iterator[list[Any]]:
    made: list[Any] = []
    try:
        yield made
    finally:
        for group in made:
            with contextlib.suppress(OSError):
                group.remove(timeout=5)
        for name in (config.cgroup_group, config.cgroup_group + spawner.HELPERS_SUFFIX):
            for base in cgroups.group_directories(group=name):
                with contextlib.suppress(OSError):
                    base.rmdir()


def _fork_in(group: Any, count: int, running: list[subprocess.Popen[str]]) -> int:
    """Start a process in `group` that forks up to `count` children; how many it could."""
    process = subprocess.Popen(
        [sys.executable, "-c", FORKER, str(count), *group.join_files()],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    running.append(process)
    assert process.stdout is not None
    return int(process.stdout.readline())


def test_sessions_at_their_own_limits_are_bounded_together(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cgroups, "host_tasks", lambda: HOST_TASKS)
    config = _config(f"adl-test-tasks-{uuid.uuid4().hex[:8]}", tmp_path)
    agents_total = int(HOST_TASKS * spawner.AGENTS_TASKS_SHARE)
    running: list[subprocess.Popen[str]] = []
    with _sessions(config) as made:
        try:
            for n in range(2):
                group, error = spawner._session_cgroup(f"s{n}-{os.getpid()}", config)
                assert group is not None, error
                made.append(group)
                group.apply(cgroups.Limits(pids_max=4096))  # each session at the operator's max_pids
            helpers = spawner._helpers_cgroup(f"h-{os.getpid()}", config)
            made.append(helpers)
            first = _fork_in(made[0], 30, running)
            second = _fork_in(made[1], 30, running)
            helper_children = _fork_in(helpers, 30, running)
        finally:
            for process in running:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    assert first == 30
    # Two sessions of 4096 pids each, and the second could start only what the first left of the
    # sessions' share; the helpers have a share of their own.
    assert first + 1 + second + 1 <= agents_total, (first, second, agents_total)
    assert helper_children + 1 <= int(HOST_TASKS * spawner.HELPERS_TASKS_SHARE)


SESSION_PIDS = 48  # the agent's memory limit (64 MiB) holds this many Pythons
BOMB = """
import os, time
started = 0
while True:
    try:
        pid = os.fork()
    except BlockingIOError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    started += 1
print(started, flush=True)
time.sleep(3)
"""


def _pids_directory(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return Path("/sys/fs/cgroup/pids") / path.lstrip("/")
    raise AssertionError(f"pid {pid} is in no v1 pids cgroup")


@pytest.mark.daemon
@pytest.mark.skipif(not Path("/sys/fs/cgroup/pids/cgroup.procs").exists(), reason="reads the v1 pids hierarchy")
def test_a_sessions_fork_bomb_stops_at_its_limit_within_the_sessions_bound(daemon: RunningDaemon) -> None:
    """Measured through the daemon: the agent's fork bomb stops at the session's pids_max, and the
    directories holding all sessions' groups and all helpers' groups carry the bounds together."""
    assert daemon.proc is not None
    argv = daemon.exec_argv("python3", "-c", BOMB, options=("--pids-max", str(SESSION_PIDS)))
    session = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert session.stdout is not None
        line = session.stdout.readline()
        base = _pids_directory(daemon.proc.pid)
        agents, helpers = base / daemon.group, base / f"{daemon.group}{spawner.HELPERS_SUFFIX}"
        figures = {
            "agents": (agents / "pids.current").read_text().strip(),
            "helpers": (helpers / "pids.current").read_text().strip(),
            "agents_max": (agents / "pids.max").read_text().strip(),
            "helpers_max": (helpers / "pids.max").read_text().strip(),
        }
    finally:
        _, err = session.communicate(timeout=60)
    print(f"forks started: {line.strip()}; {figures}")
    assert line.strip().isdigit(), (session.returncode, err)
    assert int(line) < SESSION_PIDS <= int(figures["agents"]) + 1
    assert figures["agents_max"] == str(int(cgroups.host_tasks() * spawner.AGENTS_TASKS_SHARE))
    assert figures["helpers_max"] == str(int(cgroups.host_tasks() * spawner.HELPERS_TASKS_SHARE))
    assert int(figures["helpers"]) <= spawner.HELPER_PIDS + 2 * EgressValues().max_connections
