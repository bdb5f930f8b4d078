"""A hostile member of the socket group must not crowd out the others through sessions: it may run
only so many at once (max_sessions_per_uid) while another uid still launches, and the refusals only
a session's supervisor finds (a working directory it may not use) count in its launch-refusal budget
like the daemon's own, so a flood of them is summarised, not written one by one."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from enforcer.daemon.spawner import HELPERS_SUFFIX, HELPERS_TASKS_SHARE, PREPARED_PIDS
from enforcer.sandbox import cgroups
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.launch_callers import (
    DONE,
    OTHER_UID,
    SLEEP,
    end_of,
    launch_as,
    launches,
    refused_records,
    reply_of,
    restart_with,
)
from ..helpers.prepared import children, ready, spawner_of, until, waiting
from ..helpers.sandbox import AGENT_UID

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def test_a_uid_at_its_session_bound_is_refused_while_another_uid_launches(daemon: RunningDaemon) -> None:
    restart_with(daemon, ADL_ENFORCER_MAX_SESSIONS_PER_UID="2")
    with launches() as running:
        sessions = []
        for _ in range(2):
            running.append(launch_as(daemon, AGENT_UID, argv=SLEEP, cwd="/"))
            reply = reply_of(running[-1])
            assert reply["accepted"], reply
            sessions.append(reply["session"])
        third = launch_as(daemon, AGENT_UID, argv=SLEEP, cwd="/")
        refused = reply_of(third)
        third.communicate(timeout=30)
        assert not refused["accepted"]
        assert f"uid {AGENT_UID} already runs 2 session(s)" in refused["refusal"], refused
        assert "max_sessions_per_uid is 2" in refused["refusal"], refused
        # Recorded like the other launch refusals, naming the caller.
        (record,) = [r for r in refused_records(daemon) if "max_sessions_per_uid" in r["payload"]["refusal"]]
        assert record["payload"]["caller_uid"] == AGENT_UID and record["payload"]["argv"] == SLEEP

        other = launch_as(daemon, OTHER_UID, argv=DONE, cwd="/")
        assert reply_of(other)["accepted"], "another uid still launches"
        assert end_of(other)["exit"] == 0

        # Ending one of A's sessions frees its place at once.
        assert daemon.admin_stub().TerminateSession(pb.TerminateSessionRequest(session=sessions[0])).terminated
        assert end_of(running[0])["exit"] == 137  # SIGKILL
        again = launch_as(daemon, AGENT_UID, argv=DONE, cwd="/")
        running.append(again)
        assert reply_of(again)["accepted"], "the ended session's place is free again"
        assert end_of(again)["exit"] == 0


def test_refusals_only_a_supervisor_finds_are_summarised_past_the_budget(daemon: RunningDaemon) -> None:
    """A working directory the caller may not enter is found only by its session's supervisor (it
    looks it up as the caller). Before, each such refusal was recorded in detail, past the uid's
    launch-refusal budget: one caller could flood the log every session shares."""
    restart_with(daemon, ADL_ENFORCER_LAUNCH_REFUSALS_PER_UID="3")
    closed = Path(tempfile.mkdtemp(prefix="adl-fair-closed-"))  # root's, 0700: no caller may enter it
    try:
        ends = []
        for _ in range(10):
            client = launch_as(daemon, OTHER_UID, argv=DONE, cwd=str(closed))
            assert reply_of(client)["accepted"], "the daemon cannot tell: the supervisor refuses it"
            ends.append(end_of(client))
        # A session the daemon lets run meanwhile gives its unit back: the budget is for refusals.
        ok = launch_as(daemon, AGENT_UID, argv=DONE, cwd="/")
        assert reply_of(ok)["accepted"] and end_of(ok)["exit"] == 0
        assert daemon.stop() == 0  # the summaries of windows still open are written
    finally:
        closed.rmdir()
    # Every caller is still told why, the counted ones included.
    assert all(e["reason"] == "refused" and e["exit"] == 125 for e in ends), ends
    assert all("not reachable" in e["detail"] for e in ends), ends
    ours = [r["payload"] for r in refused_records(daemon) if r["payload"].get("caller_uid") == OTHER_UID]
    detailed = [r for r in ours if "not reachable" in r.get("refusal", "")]
    onset = [r for r in ours if "launch refusals of uid" in r.get("refusal", "") and "refusals_counted_only" not in r]
    (summary,) = [r for r in ours if "refusals_counted_only" in r]
    assert len(detailed) == 3, len(detailed)
    assert len(onset) == 1, onset
    assert summary["refusals_counted_only"] == 7, summary
    # The other uid's session was neither refused nor counted.
    assert not [r for r in refused_records(daemon) if r["payload"].get("caller_uid") == AGENT_UID]


def _pids_cgroup(pid: int) -> str:
    """The pids cgroup `pid` is in (v1's pids hierarchy, or v2's one)."""
    lines = [line.split(":", 2) for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines()]
    v1 = [path for _, controllers, path in lines if "pids" in controllers.split(",")]
    return v1[0] if v1 else next(path for _, controllers, path in lines if controllers == "")


def test_prepared_supervisors_and_their_stages_are_under_the_helpers_bound(daemon: RunningDaemon) -> None:
    """Before, the supervisors prepared before any order, their stage's init and future agent sat in
    the spawner's cgroup, which no pids bound of the daemon's holds."""
    prepared = ready(daemon)
    spawner = spawner_of(daemon)
    where = f"/{daemon.group}{HELPERS_SUFFIX}/prepared-{spawner}"
    members = [*prepared, *(p for inits in prepared.values() for p in inits)]
    members += [child for inits in prepared.values() for init in inits for child in children(init)]
    assert len(members) >= 2 * 3, prepared  # each: the supervisor, init, the future agent
    for pid in members:
        assert _pids_cgroup(pid).endswith(where), (pid, Path(f"/proc/{pid}/cgroup").read_text())
    group = cgroups.existing(group=daemon.group + HELPERS_SUFFIX)[f"prepared-{spawner}"]
    pids = group.pids_directory()
    assert (pids / "pids.max").read_text().strip() == str(PREPARED_PIDS * 2)
    current = int((pids / "pids.current").read_text())
    print(f"two prepared supervisors with their stages: {current} tasks (pids.max {PREPARED_PIDS * 2})")
    assert len(members) <= current <= PREPARED_PIDS * 2
    # The directory holding it bounds every root helper's tasks together.
    assert (pids.parent / "pids.max").read_text().strip() == str(int(cgroups.host_tasks() * HELPERS_TASKS_SHARE))
    # A session handed to one leaves the group: its agent runs in the session's cgroup.
    result = daemon.adl_exec("python3", "-c", "print(open('/proc/self/cgroup').read())")
    assert result.returncode == 0, result.stderr
    assert "prepared-" not in result.stdout and daemon.group in result.stdout, result.stdout

    def refilled() -> bool:
        # A supervisor whose session just ended is listed until it is collected: wait it out.
        try:
            found = waiting(daemon)
            return len(found) == 2 and all(_pids_cgroup(pid).endswith(where) for pid in found)
        except FileNotFoundError:
            return False

    assert until(refilled, 15), "another is prepared, in the same group"
    # A stopping daemon leaves no directory behind, the prepared supervisors' included.
    assert daemon.stop() == 0
    assert not [d for d in cgroups.group_directories(group=daemon.group + HELPERS_SUFFIX) if d.exists()]


def test_a_restarted_daemon_removes_what_a_killed_spawner_left(daemon: RunningDaemon) -> None:
    """A daemon killed outright (SIGKILL) leaves its prepared supervisors' cgroup behind, emptied
    as they die with it; the next spawner removes it rather than let them pile up."""
    ready(daemon)
    old = f"prepared-{spawner_of(daemon)}"
    daemon.kill()
    helpers = daemon.group + HELPERS_SUFFIX
    assert until(lambda: not cgroups.existing(group=helpers)[old].members(), 10)
    assert old in cgroups.existing(group=helpers)
    daemon.start()
    assert old not in cgroups.existing(group=helpers)
