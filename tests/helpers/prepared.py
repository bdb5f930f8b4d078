"""What tests of the daemon's prepared sessions (spawner.py, SpawnerConfig.prepared_sessions) see
of them from outside: the spawner's children, the prepared supervisors waiting, their stage's init."""

from __future__ import annotations

from pathlib import Path

from enforcer.v1 import enforcer_pb2 as pb

from .daemon import RunningDaemon
from .processes import until


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def spawner_of(daemon: RunningDaemon) -> int:
    assert daemon.proc is not None
    (spawner,) = [p for p in children(daemon.proc.pid) if b"enforcer.cli.enforcerd" in cmdline(p)]
    return spawner


def cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def waiting(daemon: RunningDaemon) -> dict[int, list[int]]:
    """The spawner's prepared supervisors (its children that run no session and are not its
    guardian, an exec'd `python -S -I`), each with its own children (the stage's init)."""
    spawner = spawner_of(daemon)
    running = {s.pid for s in daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions}
    found = {}
    for pid in children(spawner):
        if pid in running or cmdline(pid).split(b"\0")[1:3] == [b"-S", b"-I"]:
            continue
        found[pid] = children(pid)
    return found


def gone(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def ready(daemon: RunningDaemon, count: int = 2) -> dict[int, list[int]]:
    """Wait for `count` prepared supervisors, each with its stage's init alone (the stage collected).
    Those prepared before the spawner first compiled the test agent's documents were retired then:
    a first launch compiles them."""
    if not any(r["intent"].endswith(".launch") for r in daemon.records()):
        assert daemon.adl_exec("python3", "-c", "pass").returncode == 0

    def prepared() -> bool:
        # The one child must be init, not the stage before its exit (its only child too for a while).
        found = waiting(daemon)
        return len(found) == count and all(len(c) == 1 and is_init(c[0]) for c in found.values())

    assert until(prepared, 15), waiting(daemon)
    return waiting(daemon)


def is_init(pid: int) -> bool:
    """Whether `pid` is pid 1 of a PID namespace of its own."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    nspid = next((line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")), [])
    return len(nspid) >= 2 and nspid[-1] == "1"
