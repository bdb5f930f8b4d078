"""Each launch takes a unit of its caller's launch-refusal budget ahead, for the refusal its
supervisor may find, and gives it back when the session ends without one. However a long-lived
caller's sessions end (normally, by TerminateSession, with their supervisor killed, refused by the
daemon), no unit may be kept for good or given back twice: its budget for refusals in detail stays
exactly what the operator set."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest

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
from ..helpers.prepared import until

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

BUDGET = 3


def _supervisor(daemon: RunningDaemon, session: str) -> int:
    def pid() -> int:
        found = [
            s.pid for s in daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions if s.session == session
        ]
        return found[0] if found else 0

    assert until(lambda: pid() > 0, 10), "the spawner reports the supervisor's pid"
    return pid()


def test_however_sessions_end_the_refusal_budget_stays_whole(daemon: RunningDaemon) -> None:
    restart_with(daemon, ADL_ENFORCER_LAUNCH_REFUSALS_PER_UID=str(BUDGET), ADL_ENFORCER_MAX_SESSIONS_PER_UID="2")
    closed = Path(tempfile.mkdtemp(prefix="adl-units-closed-"))  # root's, 0700: the caller cannot enter it
    try:
        with launches() as running:
            for _ in range(2 * BUDGET):  # more sessions than units: each gave its unit back
                client = launch_as(daemon, OTHER_UID, argv=DONE, cwd="/")
                assert reply_of(client)["accepted"]
                assert end_of(client)["exit"] == 0
            # Ended by TerminateSession while it runs.
            running.append(launch_as(daemon, OTHER_UID, argv=SLEEP, cwd="/"))
            reply = reply_of(running[-1])
            assert reply["accepted"]
            _supervisor(daemon, reply["session"])
            assert daemon.admin_stub().TerminateSession(pb.TerminateSessionRequest(session=reply["session"])).terminated
            end_of(running[-1])
            # Ended by its supervisor's death.
            running.append(launch_as(daemon, OTHER_UID, argv=SLEEP, cwd="/"))
            reply = reply_of(running[-1])
            assert reply["accepted"]
            os.kill(_supervisor(daemon, reply["session"]), signal.SIGKILL)
            end_of(running[-1])
            sessions = lambda: daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions  # noqa: E731
            assert until(lambda: not sessions(), 10), "both ends were reported"

            # Now refusals only a supervisor finds: exactly BUDGET in detail, the rest counted.
            for _ in range(BUDGET + 2):
                client = launch_as(daemon, OTHER_UID, argv=DONE, cwd=str(closed))
                assert reply_of(client)["accepted"]
                assert end_of(client)["exit"] == 125
        assert daemon.stop() == 0  # the summaries of windows still open are written
    finally:
        closed.rmdir()
    ours = [r["payload"] for r in refused_records(daemon) if r["payload"].get("caller_uid") == OTHER_UID]
    detailed = [r for r in ours if "not reachable" in r.get("refusal", "")]
    (summary,) = [r for r in ours if "refusals_counted_only" in r]
    assert len(detailed) == BUDGET, [r.get("refusal") for r in ours]
    assert summary["refusals_counted_only"] == 2, summary
