"""Advisory locks on host files from inside a real sandbox: flock and fcntl locks need only a
descriptor the agent may open for reading, and no Landlock or seccomp right tells a host file from
the agent's own, so an agent can make a host process that waits for such a lock wait. What holds:
leases are refused (they need the file's owner), every lock ends with the session (its wall clock
kills the agent), and the gap is stated in the launch's "not covered" layer and in the evidence."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from ..helpers.sandbox import PROBE_CHECK, Result, Sandbox, needs_root

pytestmark = needs_root

PROBE = (
    PROBE_CHECK
    + """
import fcntl, time
fd = os.open(os.environ["ALLOWED_FILE"], os.O_RDONLY)
check("F_SETLEASE", lambda: fcntl.fcntl(fd, 1024, fcntl.F_RDLCK))
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
print("LOCKED", flush=True)
time.sleep(60)
"""
)


def host_can_lock(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # releases whatever this process took


def test_locks_on_a_readable_host_file_end_with_the_session(sandbox: Sandbox) -> None:
    target = sandbox.ref / "doc.txt"  # root's file, granted read-only
    output = sandbox.ws / "probe.out"
    output.touch()
    os.chown(output, 65534, 65534)
    results: list[Result] = []
    run = threading.Thread(
        target=lambda: results.append(sandbox.python(PROBE, env={"ALLOWED_FILE": str(target)}, stdout=output))
    )
    run.start()
    try:
        deadline = time.monotonic() + 30
        while "LOCKED" not in output.read_text() and run.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "LOCKED" in output.read_text(), output.read_text()
        assert not host_can_lock(target)  # the gap the "not covered" layer states
    finally:
        run.join(timeout=60)
    assert not run.is_alive()
    (result,) = results
    assert result.record("exit")["payload"]["reason"] == "timeout", result.err
    assert "BLOCKED F_SETLEASE 13" in result.out, result.out + result.err
    assert "ESCAPED" not in result.out, result.out
    assert host_can_lock(target)  # the session's end released every lock
    gaps = result.record("session.evidence")["payload"]["evidence"]["limits"]["not_enforced"]
    assert any(g.startswith("advisory locks") for g in gaps), gaps
