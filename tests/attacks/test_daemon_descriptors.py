"""One caller floods both of the daemon's sockets with connections that wait: each socket's connections
must keep to their share of the file limit, so the other socket's callers and the daemon's own
descriptors (the audit log above all) are never starved."""

from __future__ import annotations

import array
import os
import socket
import subprocess
import sys
import time

import pytest

from enforcer.daemon.launch import FD_RESERVE

from ..helpers.daemon import REPO, RunningDaemon
from ..helpers.sandbox import AGENT_GID, AGENT_UID

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

LIMIT = 1024

CHECK = """
import sys, grpc
from enforcer.v1 import enforcer_pb2 as pb, enforcer_pb2_grpc as pb_grpc
stub = pb_grpc.EnforcerStub(grpc.insecure_channel("unix:" + sys.argv[1]))
request = pb.CheckRequest(agent="Fast", tool=pb.ToolCall(name="read_note", arguments_json='{"name": "n"}'))
print(stub.Check(request, timeout=10).decision_id)
"""


def test_a_flood_of_both_sockets_leaves_the_other_callers_and_the_daemon_descriptors(daemon: RunningDaemon) -> None:
    """Each listener sized its connections from the whole room left under the file limit, and the relay
    counted two descriptors a connection where it holds three: at a limit of 1024, waiting launch
    connections and idle API connections took 1023 descriptors, and the audit log's next sync failed
    (EMFILE), which once ended the daemon."""
    daemon.stop()
    daemon.wrap = ["prlimit", f"--nofile={LIMIT}:{LIMIT}", "--"]
    daemon.start()
    assert daemon.proc is not None
    pid = daemon.proc.pid
    held: list[socket.socket] = []
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(700):  # launch connections, each with stdin, stdout and stderr attached
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            held.append(conn)
            conn.connect(str(daemon.launch))
            conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 3).tobytes())])
        for _ in range(400):  # API connections that never send a request
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            held.append(conn)
            conn.connect(str(daemon.api))
        time.sleep(1.0)  # both loops have accepted what they will
        used = len(os.listdir(f"/proc/{pid}/fd"))
        print(f"\nthe daemon holds {used} of {LIMIT} descriptors under the flood")
        assert LIMIT - used >= FD_RESERVE, f"the flood left the daemon {LIMIT - used} descriptors"
        # Another uid's Check (API socket) and launch (launch socket) still go through, recorded.
        as_agent = ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_GID}", "--clear-groups"]
        check = subprocess.run(
            [*as_agent, sys.executable, "-c", CHECK, str(daemon.api)], capture_output=True, text=True, cwd=REPO
        )
        assert check.returncode == 0, check.stderr[-2000:]
        decision_id = check.stdout.strip()
        launched = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"), timeout=30)
        assert launched.returncode == 0 and launched.stdout == "workspace notes\n", launched.stderr
        assert daemon.proc.poll() is None and daemon.health() == "SERVING", daemon.log.read_text()[-2000:]
        assert [r for r in daemon.records() if r["payload"].get("decision_id") == decision_id]
    finally:
        os.close(null)
        for conn in held:
            conn.close()
