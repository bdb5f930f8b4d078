"""The guardian removes the session's cgroup once adl-exec is gone, however it goes. It shares
adl-exec's process group, so a terminal's hang-up (SIGHUP) or a stop of the whole group (SIGTERM,
as `kill -TERM -PGID` or a service manager sends) reaches it too: adl-exec passes those on to the
agent, which may ignore them and run on. The guardian must survive them, or adl-exec killed later
leaves the session's cgroup behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time

import pytest

from enforcer.sandbox import cgroups

from ..helpers.sandbox import Sandbox, needs_root, session_cgroups

pytestmark = needs_root


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM], ids=["SIGHUP", "SIGTERM"])
def test_a_signal_to_adl_execs_group_leaves_the_guardian_on_duty(sandbox: Sandbox, sig: int) -> None:
    code = (
        f"import signal, time\nsignal.signal({int(sig)}, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(20)\n"
    )
    proc = subprocess.Popen(
        sandbox.exec_argv("python3", "-c", code),
        env=sandbox.environ(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # adl-exec leads a process group of its own, as a terminal's job
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert session_cgroups(sandbox.group)
        os.killpg(proc.pid, sig)
        time.sleep(0.3)  # the agent ignores it and runs on
        assert proc.poll() is None
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while session_cgroups(sandbox.group) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert session_cgroups(sandbox.group) == [], "adl-exec's death left the session's cgroup"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        for session in cgroups.existing(group=sandbox.group).values():
            session.remove(timeout=5)
