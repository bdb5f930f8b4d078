"""A hostile member of the socket group against the daemon's launch socket: requests that never
end, each held just below the frame limit. What the daemon buffers for requests still arriving
must stay bounded, and a launch by someone else must still go through."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from enforcer.framing import MAX_FRAME

from ..helpers.daemon import RunningDaemon

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

UNFINISHED = 48  # requests, each one byte short of MAX_FRAME: several hundred MiB if all were kept
GROWTH_MAX = 96 << 20  # what the daemon's peak resident size may grow by meanwhile


def _peak_resident(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmHWM for pid {pid}")


def test_unfinished_requests_cannot_make_the_daemon_hold_their_bytes(daemon: RunningDaemon) -> None:
    assert daemon.proc is not None
    before = _peak_resident(daemon.proc.pid)
    held: list[socket.socket] = []
    try:
        for _ in range(UNFINISHED):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            held.append(conn)
            conn.settimeout(10)
            conn.connect(str(daemon.launch))
            try:
                conn.sendall(MAX_FRAME.to_bytes(4, "big") + bytes(MAX_FRAME - 1))
            except OSError:  # the daemon closed it: what it refuses to hold is not in its memory
                continue
        growth = _peak_resident(daemon.proc.pid) - before
        assert growth < GROWTH_MAX, f"the daemon's peak resident size grew by {growth >> 20} MiB"
        # Someone else's launch still goes through while the unfinished requests are held.
        result = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"))
        assert result.returncode == 0 and result.stdout == "workspace notes\n", result.stderr
    finally:
        for conn in held:
            conn.close()
