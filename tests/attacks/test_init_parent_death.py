"""The session's init sets its parent-death signal only once the stage has handed it to the
launcher (the hand-over would deliver it). A launcher killed before that (adl-exec SIGKILLed while
its stage exits) leaves the signal tied to whichever process adopted init instead: init must then
end by itself, and the namespace with it, or pid 2 may go on without a launcher (and, should the
guardian be gone too, with nothing to end the session)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import time
from pathlib import Path

import pytest

from enforcer.sandbox import pidns

from ..helpers.processes import alive, until
from ..helpers.sandbox import needs_root

pytestmark = needs_root
PR_SET_CHILD_SUBREAPER = 36


def _fill(fd: int) -> int:
    """Fill the pipe `fd` writes to, so that the stage's announcement of init blocks: the stage
    then cannot exit, and init waits, until the test drains it."""
    os.set_blocking(fd, False)
    filled = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            filled += os.write(fd, b"\0" * 4096)
    os.set_blocking(fd, True)
    return filled


def _read_lines(fd: int, count: int, timeout: float = 10.0) -> dict[str, int]:
    data = b""
    while data.count(b"\n") < count:
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, "nothing reported in time"
        chunk = os.read(fd, 64)
        assert chunk, "the reporting processes are gone"
        data += chunk
    return {line[:1].decode(): int(line[1:]) for line in data.split(b"\n") if line}


@pytest.mark.parametrize("small", [True, False], ids=["small-init", "forked-init"])
def test_init_adopted_after_its_launcher_died_ends_the_session(tmp_path: Path, small: bool) -> None:
    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # adopts the stage and init, as systemd would
    join = tmp_path / "cgroup.procs"
    status_read, status_write = os.pipe()
    report_read, report_write = os.pipe()
    filled = _fill(status_write)
    launcher = os.fork()
    if launcher == 0:
        try:
            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            stage = os.fork()
            if stage == 0:
                try:
                    joined = pidns.fork_init(status_write, [str(join)] if small else None)
                    os.write(report_write, f"a{pidns.host_pid()}\n".encode())
                    joined()
                    time.sleep(30)
                finally:
                    os._exit(1)
            os.write(report_write, f"s{stage}\n".encode())
            signal.pause()
        finally:
            os._exit(1)
    os.close(report_write)
    os.close(status_write)
    pids = {}
    init = None
    try:
        pids = _read_lines(report_read, 2)
        stage, pid2 = pids["s"], pids["a"]
        assert until(lambda: "pipe_write" in Path(f"/proc/{stage}/wchan").read_text(), 10, every_s=0.01), (
            "no blocked stage"
        )
        os.kill(launcher, signal.SIGKILL)
        os.waitpid(launcher, 0)
        while filled:  # the stage announces init, then exits
            filled -= len(os.read(status_read, filled))
        init = pidns.read_pid(status_read)
        assert init is not None
        os.waitpid(stage, 0)  # adopted here when the launcher died
        assert until(lambda: not alive(init) and not alive(pid2), 5, every_s=0.01), "init outlived its launcher"
    finally:
        for pid in (pids.get("a"), init):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in (launcher, pids.get("s"), init):
            if pid is not None:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
        os.close(status_read)
        os.close(report_read)
