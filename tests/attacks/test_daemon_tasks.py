"""The daemon out of tasks. Every session's processes count against the unit's TasksMax, so a
hostile agent (or a caller holding threads) can leave the daemon unable to start a thread or fork:
each request that needed one must fail alone, with a record where it is a launch, and the daemon
must serve on once tasks are free again."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon

PIDS_V1 = Path("/sys/fs/cgroup/pids")

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
    pytest.mark.skipif(not (PIDS_V1 / "cgroup.procs").exists(), reason="needs the cgroup v1 pids controller"),
]


def _pids_cgroup(pid: int) -> Path:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "pids" in controllers.split(","):
            return PIDS_V1 / path.lstrip("/")
    raise AssertionError(f"pid {pid} is in no pids cgroup")


@contextlib.contextmanager
def capped(pid: int, extra: int) -> Iterator[None]:
    """`pid` in a pids cgroup of its own allowing its tasks of now and `extra` more; put back after,
    with whatever it started meanwhile, and the cgroup (and any made below it) removed."""
    home = _pids_cgroup(pid)
    cap = PIDS_V1 / f"adl-test-cap-{secrets.token_hex(4)}"
    cap.mkdir()
    try:
        (cap / "cgroup.procs").write_text(str(pid))
        (cap / "pids.max").write_text(str(len(os.listdir(f"/proc/{pid}/task")) + extra))
        yield
    finally:
        for _ in range(3):  # processes forked while moving are moved on the next pass
            for moved in (cap / "cgroup.procs").read_text().split():
                with contextlib.suppress(OSError):
                    (home / "cgroup.procs").write_text(moved)
        deadline = time.monotonic() + 10
        while True:
            try:
                for sub in sorted((p for p in cap.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    sub.rmdir()
                cap.rmdir()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def test_worker_threads_that_cannot_start_do_not_end_the_sync_server(daemon: RunningDaemon) -> None:
    """grpcio starts its pool's threads from the thread that polls for calls: a RuntimeError there
    ended it, and health, Status and WaitApproval never answered again, after the cap was lifted too."""
    assert daemon.proc is not None
    answers: list[str] = []
    with capped(daemon.proc.pid, 0):
        stub = daemon.enforcer()

        def status() -> None:
            try:
                stub.Status(pb.StatusRequest(), timeout=3)
                answers.append("OK")
            except grpc.RpcError as exc:
                answers.append(exc.code().name)

        callers = [threading.Thread(target=status) for _ in range(24)]
        for caller in callers:
            caller.start()
        for caller in callers:
            caller.join()
    print(f"while no thread could start: {answers.count('OK')} of {len(answers)} Status calls answered")
    deadline = time.monotonic() + 5
    while daemon.health() != "SERVING" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert daemon.health() == "SERVING", daemon.log.read_text()[-2000:]
    assert daemon.enforcer().Status(pb.StatusRequest(), timeout=5).serving
    assert "no thread could start" in daemon.log.read_text()


@pytest.mark.parametrize(("extra", "detail"), [(1, "stage could not be started"), (2, "no thread could be started")])
def test_a_session_the_spawner_cannot_start_is_refused_and_recorded(
    daemon: RunningDaemon, extra: int, detail: str
) -> None:
    """The supervisor forks the session's stage, then starts threads: out of tasks at either step,
    it died without a word (adl-exec: "lost contact"), and the session left no record."""
    assert daemon.proc is not None
    spawner = int(Path(f"/proc/{daemon.proc.pid}/task/{daemon.proc.pid}/children").read_text().split()[0])
    with capped(spawner, extra):  # the supervisor, then `extra` - 1 more tasks
        refused = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"), timeout=30)
    assert refused.returncode == 125 and detail in refused.stderr, refused.stderr
    records = [r["payload"] for r in daemon.records() if r["intent"] == "adl.enforcer.refused"]
    assert [r for r in records if detail in r["refusal"] and r.get("caller_uid") is not None], records
    result = daemon.adl_exec("cat", str(daemon.box.ws / "notes.txt"), timeout=30)
    assert result.returncode == 0 and result.stdout == "workspace notes\n", result.stderr
