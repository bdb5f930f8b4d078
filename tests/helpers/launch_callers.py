"""Launches over the daemon's raw launch socket by callers of other uids, for the tests of the
operator's bounds on sessions and of launch refusals (tests/attacks/test_daemon_fair_sessions.py,
test_daemon_bound_waits.py, test_daemon_refusal_units.py)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

from .daemon import REPO, RunningDaemon
from .sandbox import AGENT_GID, AGENT_UID

OTHER_UID = 63000 + os.getpid() % 1000  # a second caller; setpriv needs no account for a number

# Launches over the raw launch socket; prints the reply, then how the session ended, one JSON line each.
CLIENT = """
import json, os, socket, sys
from enforcer.framing import recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb
spec = json.loads(sys.argv[2])
request = pb.LaunchRequest(environ={"PATH": "/usr/bin:/bin"}, **spec)
null = os.open(os.devnull, os.O_RDWR)
with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
    conn.connect(sys.argv[1])
    send_frame(conn, request.SerializeToString(), [null] * 3)
    reply = pb.LaunchReply.FromString(recv_frame(conn)[0])
    print(json.dumps({"accepted": reply.accepted, "session": reply.session, "refusal": reply.refusal}), flush=True)
    if reply.accepted:
        frame = recv_frame(conn)
        ended = pb.SessionEnded.FromString(frame[0]) if frame else pb.SessionEnded(reason="lost")
        print(json.dumps({"reason": ended.reason, "exit": ended.exit_code, "detail": ended.detail}), flush=True)
"""
SLEEP = ["python3", "-c", "import time; time.sleep(60)"]
DONE = ["python3", "-c", "pass"]


def as_caller(uid: int, script: str, *args: str) -> subprocess.Popen[str]:
    """`script` (Python source) run as `uid`, in the agents' group only, from /."""
    return subprocess.Popen(
        [
            *("setpriv", f"--reuid={uid}", f"--regid={AGENT_GID}", "--clear-groups"),
            *(sys.executable, "-c", script, *args),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)},
    )


def launch_as(daemon: RunningDaemon, uid: int, **spec: Any) -> subprocess.Popen[str]:
    """A launch of the agent Sandboxed by `uid`, `spec` its LaunchRequest's members: reply_of()
    reads the daemon's answer, end_of() how the session ended."""
    return as_caller(uid, CLIENT, str(daemon.launch), json.dumps({"agent": "Sandboxed", **spec}))


def reply_of(client: subprocess.Popen[str]) -> dict[str, Any]:
    assert client.stdout is not None
    line = client.stdout.readline()
    assert line, client.communicate(timeout=30)
    return dict(json.loads(line))


def end_of(client: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = client.communicate(timeout=60)
    assert out.strip(), err
    return dict(json.loads(out.strip().splitlines()[-1]))


@contextlib.contextmanager
def launches() -> Iterator[list[subprocess.Popen[str]]]:
    """A list to add launches to: those still running at the end are killed, ending their sessions."""
    running: list[subprocess.Popen[str]] = []
    try:
        yield running
    finally:
        for client in running:
            with contextlib.suppress(ProcessLookupError):
                client.kill()  # the caller leaving ends its session
            client.communicate(timeout=30)


def restart_with(daemon: RunningDaemon, **env: str) -> None:
    """Restart the daemon with `env`, AGENT_UID and OTHER_UID both callers of every agent."""
    daemon.stop()
    daemon.write_agents(max_concurrent=None)  # no bound of the agent's own: only the operator's
    callers = {"*": [f"uid:{AGENT_UID}", f"uid:{OTHER_UID}"]}
    daemon.extra_env.update({"ADL_ENFORCER_AGENT_CALLERS": json.dumps(callers), **env})
    daemon.start()


def refused_records(daemon: RunningDaemon) -> list[dict[str, Any]]:
    return [r for r in daemon.records() if r["intent"] == "adl.enforcer.refused"]
