"""A hostile member of the socket group against the daemon's launch socket: requests that never
end, each held just below the frame limit. What the daemon buffers for requests still arriving
must stay bounded, and a launch by someone else must still go through."""

from __future__ import annotations

import array
import os
import secrets
import socket
import time
from pathlib import Path

import pytest

from enforcer.daemon.launch import REFUSALS_DETAILED
from enforcer.framing import MAX_FRAME, recv_frame, send_frame
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.sandbox import AGENT_UID

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

UNFINISHED = 64  # requests, each one byte short of MAX_FRAME: 512 MiB if all were kept
GROWTH_MAX = 160 << 20  # what the daemon's peak resident size may grow by meanwhile (64 MiB held, and copies)


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


REFUSED = 9  # whole requests the daemon refuses, each near MAX_FRAME
AUDIT_GROWTH_MAX = 1 << 20  # what their refusal records may add to the audit log, together


def _audit_bytes(daemon: RunningDaemon) -> int:
    return sum(f.stat().st_size for f in daemon.audit.rglob("*") if f.is_file())


def _refused(daemon: RunningDaemon, request: pb.LaunchRequest) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as conn:
        conn.settimeout(30)
        conn.connect(str(daemon.launch))
        null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
        try:
            send_frame(conn, request.SerializeToString(), [null] * 3)
        finally:
            os.close(null)
        frame = recv_frame(conn)
    assert frame is not None
    reply = pb.LaunchReply.FromString(frame[0])
    assert not reply.accepted
    return reply.refusal


def test_refused_requests_cannot_flood_the_audit_log_with_their_own_bytes(daemon: RunningDaemon) -> None:
    """A refusal is recorded with what was asked (argv, the agent's name in the reason): a caller
    must not make each record as large as its request."""
    big = "A" * 2000
    requests = [
        pb.LaunchRequest(agent="Sandboxed", argv=[big] * ((MAX_FRAME - (1 << 16)) // (len(big) + 3)), cwd="/"),
        pb.LaunchRequest(agent="x" * (MAX_FRAME - (1 << 16)), argv=["cat"], cwd="/"),
        pb.LaunchRequest(agent="Sandboxed", argv=["cat"], cwd="c" * (MAX_FRAME - (1 << 16))),  # not absolute
    ]
    before = _audit_bytes(daemon)
    for at in range(REFUSED):
        assert _refused(daemon, requests[at % len(requests)])
    growth = _audit_bytes(daemon) - before
    assert growth < AUDIT_GROWTH_MAX, f"{REFUSED} refused requests added {growth >> 20} MiB to the audit log"
    refusals = [r["payload"] for r in daemon.records() if r["intent"].rsplit(".", 1)[-1] == "refused"]
    assert len(refusals) == REFUSED, "every refusal is still recorded"
    # ... saying how large what was cut was.
    assert refusals[0]["argv_cut"]["arguments"] == len(requests[0].argv)
    assert refusals[1]["refusal"].endswith(" more characters)")
    assert refusals[2]["cwd"].endswith(" more characters)")


PIDS_V1 = Path("/sys/fs/cgroup/pids")


def _pids_cgroup(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return PIDS_V1 / path.lstrip("/")
    raise AssertionError(f"pid {pid} is in no pids cgroup")


@pytest.mark.skipif(not (PIDS_V1 / "cgroup.procs").exists(), reason="needs the cgroup v1 pids controller")
def test_a_request_whose_thread_cannot_start_costs_only_that_request(daemon: RunningDaemon) -> None:
    """Out of tasks (the unit's TasksMax, or a flood of requests holding threads), the thread that
    would handle a request cannot start: that request fails, and the launch socket serves on."""
    assert daemon.proc is not None
    pid = daemon.proc.pid
    home = _pids_cgroup(pid)
    cap = PIDS_V1 / f"adl-test-{secrets.token_hex(4)}"
    cap.mkdir()
    try:
        (cap / "cgroup.procs").write_text(str(pid))
        (cap / "pids.max").write_text(str(len(os.listdir(f"/proc/{pid}/task"))))  # no thread more
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as conn:
            conn.settimeout(10)
            conn.connect(str(daemon.launch))
            send_frame(conn, pb.LaunchRequest(agent="Sandboxed", argv=["cat"], cwd="/").SerializeToString())
            assert recv_frame(conn) is None, "a request no thread could take is closed unanswered"
    finally:
        (home / "cgroup.procs").write_text(str(pid))
        cap.rmdir()
    result = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"), timeout=30)
    assert result.returncode == 0 and result.stdout == "workspace notes\n", result.stderr


FLOOD_S = 3


def test_one_callers_flood_of_refusals_is_counted_not_written_one_by_one(daemon: RunningDaemon) -> None:
    """Every refusal is answered; beyond REFUSALS_DETAILED per uid and window, the log counts them
    instead of holding one record each, and another uid's refusal is still recorded in detail."""
    request = pb.LaunchRequest(agent="Sandboxed", argv=["cat"], cwd="/")  # a root caller: refused
    before = _audit_bytes(daemon)
    sent, end = 0, time.monotonic() + FLOOD_S
    while time.monotonic() < end:
        assert "host root" in _refused(daemon, request)
        sent += 1
    growth = _audit_bytes(daemon) - before
    other = daemon.adl_exec("cat", "/etc/hostname", agent="Nobody")
    assert other.returncode != 0 and "no policy is loaded" in other.stderr
    refusals = [r["payload"] for r in daemon.records() if r["intent"].rsplit(".", 1)[-1] == "refused"]
    ours = [r for r in refusals if r.get("caller_uid") == 0 and "argv" in r]
    print(f"{sent} refusals in {FLOOD_S} s: {len(ours)} records, the log grew by {growth} bytes")
    assert sent > 2 * REFUSALS_DETAILED, f"the flood was too slow to tell ({sent} refusals)"
    assert len(ours) == REFUSALS_DETAILED
    (marker,) = [r for r in refusals if r.get("caller_uid") == 0 and "argv" not in r]
    assert "counted" in marker["refusal"]
    assert [r for r in refusals if r.get("caller_uid") == AGENT_UID and "Nobody" in r["refusal"]]


def test_descriptors_attached_to_unfinished_requests_leave_the_daemon_room(daemon: RunningDaemon) -> None:
    """Each waiting connection may hold three descriptors besides its own: under a soft file limit
    of 1024, 700 of them with descriptors attached must not take what a launch needs."""
    daemon.stop()
    daemon.wrap = ["prlimit", "--nofile=1024:1024", "--"]
    daemon.start()
    _refused(daemon, pb.LaunchRequest(agent="Sandboxed", argv=["cat"], cwd="/"))  # the launch socket is up
    held: list[socket.socket] = []
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for _ in range(700):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            held.append(conn)
            conn.connect(str(daemon.launch))
            conn.sendmsg([b"\0"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [null] * 3).tobytes())])
        started = time.monotonic()
        result = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"), timeout=30)
        took = time.monotonic() - started
        assert result.returncode == 0 and result.stdout == "workspace notes\n", result.stderr
        # Not after the waiting connections' deadline (5 s) has freed their descriptors.
        assert took < 3, f"the launch took {took:.1f} s"
    finally:
        os.close(null)
        for conn in held:
            conn.close()
