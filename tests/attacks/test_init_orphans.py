"""The session's init (pidns_init.py, the small interpreter of an adl-exec session) reaps every
process of its namespace and reports the agent's status only: an agent that leaves zombies and
detached orphans behind (which ignore the forwarded signals) must neither change its reported
status nor keep the session, or a process, alive after it exits."""

from __future__ import annotations

import time

from ..helpers.sandbox import Sandbox, needs_root
from .test_session_init import _holding

pytestmark = needs_root


def test_zombies_and_detached_orphans_neither_change_the_status_nor_outlive_the_agent(sandbox: Sandbox) -> None:
    code = (
        f"# {sandbox.root}\n"  # names the sandbox on every process's command line
        "import os, signal, time\n"
        "for _ in range(50):\n"
        "    if os.fork() == 0:\n"
        "        os._exit(3)\n"  # zombies of the agent, init's once it exits
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(0.05)\n"
        "            os._exit(5)\n"  # orphans that end first: init reaps them before the agent
        "        os._exit(6)\n"
        "for _ in range(5):\n"
        "    if os.fork() == 0:\n"
        "        if os.fork() == 0:\n"
        "            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):\n"
        "                signal.signal(sig, signal.SIG_IGN)\n"
        "            os.setsid()\n"
        "            time.sleep(60)\n"
        "        os._exit(4)\n"
        "time.sleep(0.3)\n"
        "raise SystemExit(9)\n"
    )
    started = time.monotonic()
    r = sandbox.python(code, timeout=30)
    took = time.monotonic() - started
    assert r.code == 9, (r.out, r.err)
    assert r.record("exit")["payload"]["reason"] == "exit"
    assert took < sandbox.permissions["resource_limits"]["max_duration_sec"], took
    assert _holding((str(sandbox.root).encode(),)) == []
