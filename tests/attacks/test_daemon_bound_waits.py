"""A hostile caller at its session bound must not hold the daemon's threads and descriptors with
launches that wait for a place: a launch at a full bound waits up to a second for a session that
is ending, on a thread of its own holding its connection and the three descriptors it sent. Before,
every such launch waited, so a uid at its bound that sent launches as fast as it could kept that
many threads and four times that many descriptors in the daemon, a second at a time, with no bound
of its own; only so many may now wait per uid (as many as its bound lets it run), the rest are
refused at once."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ..helpers.daemon import RunningDaemon
from ..helpers.launch_callers import (
    DONE,
    OTHER_UID,
    SLEEP,
    as_caller,
    end_of,
    launch_as,
    launches,
    reply_of,
    restart_with,
)
from ..helpers.sandbox import AGENT_UID

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

FLOOD = 150  # launches sent at once by the uid at its bound

# Sends FLOOD launches without reading any reply, then prints how many were refused and how fast.
FLOODER = """
import json, os, socket, sys, time
from enforcer.framing import recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb
path, count = sys.argv[1], int(sys.argv[2])
request = pb.LaunchRequest(agent="Sandboxed", argv=["true"], cwd="/", environ={"PATH": "/usr/bin:/bin"})
null = os.open(os.devnull, os.O_RDWR)
conns = []
for _ in range(count):
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(path)
    send_frame(conn, request.SerializeToString(), [null] * 3)
    conns.append(conn)
print("sent", flush=True)
refusals = []
for conn in conns:
    conn.settimeout(30)
    frame = recv_frame(conn)
    reply = pb.LaunchReply.FromString(frame[0])
    refusals.append(reply.refusal if not reply.accepted else "")
    conn.close()
print(json.dumps(refusals), flush=True)
"""


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_launches_waiting_at_a_uids_bound_are_bounded(daemon: RunningDaemon) -> None:
    restart_with(daemon, ADL_ENFORCER_MAX_SESSIONS_PER_UID="1", ADL_ENFORCER_LAUNCH_REFUSALS_PER_UID="5")
    assert daemon.proc is not None
    with launches() as running:
        running.append(launch_as(daemon, AGENT_UID, argv=SLEEP, cwd="/"))
        assert reply_of(running[-1])["accepted"]
        time.sleep(0.5)  # the launch's thread is gone
        baseline = _threads(daemon.proc.pid)
        flooder = as_caller(AGENT_UID, FLOODER, str(daemon.launch), str(FLOOD))
        try:
            peak = baseline
            deadline = time.monotonic() + 20
            while flooder.poll() is None and time.monotonic() < deadline:
                peak = max(peak, _threads(daemon.proc.pid))
                time.sleep(0.01)
            out, err = flooder.communicate(timeout=30)
        finally:
            if flooder.poll() is None:
                flooder.kill()
                flooder.communicate(timeout=30)
        refusals = json.loads(out.splitlines()[-1])
        assert len(refusals) == FLOOD and all(refusals), (out, err)
        print(f"{FLOOD} launches at a uid's bound: the daemon's threads peaked {peak - baseline} above {baseline}")
        # One may wait for the uid's one session to end; the rest have nothing to wait for.
        assert peak - baseline < FLOOD // 3, (baseline, peak)
        assert all(f"uid {AGENT_UID} already runs 1 session(s)" in r for r in refusals), set(refusals)
        at_once = [r for r in refusals if f"launches of uid {AGENT_UID} are already waiting for a place" in r]
        assert len(at_once) >= FLOOD - FLOOD // 3, len(at_once)

        # Another uid launches meanwhile, unhindered.
        other = launch_as(daemon, OTHER_UID, argv=DONE, cwd="/")
        assert reply_of(other)["accepted"]
        ended = end_of(other)
        assert ended["exit"] == 0, ended
