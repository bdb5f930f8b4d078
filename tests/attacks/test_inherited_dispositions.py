"""adl-exec started by a caller that ignores SIGCHLD (a program that called
`signal(SIGCHLD, SIG_IGN)` and then ran it): an ignored disposition survives exec, and with it the kernel reaps every
child at once, so adl-exec's waits for its creation guard or the session's status find no child and
every launch was refused. adl-exec and adl-enforcerd set SIGCHLD back to its default first."""

from __future__ import annotations

import sys

import pytest

from ..helpers.sandbox import Sandbox, needs_root

IGNORE_SIGCHLD = [
    sys.executable,
    "-c",
    "import os, signal, sys; signal.signal(signal.SIGCHLD, signal.SIG_IGN); os.execv(sys.argv[1], sys.argv[1:])",
]


@needs_root
@pytest.mark.parametrize("writable", [True, False], ids=["creation-guard", "read-only"])
def test_a_caller_ignoring_sigchld_still_gets_its_command_run_and_its_status(sandbox: Sandbox, writable: bool) -> None:
    sandbox.wrap = IGNORE_SIGCHLD
    if not writable:  # no writable grant: no creation guard, the session's own waits only
        sandbox.permissions["filesystem"] = {"allowed_paths": [{"path": f"{sandbox.ws}/**", "access": "read"}]}
    ran = sandbox.python("import sys; print('ran'); sys.exit(7)")
    assert ran.code == 7, ran.err
    assert ran.out.strip() == "ran"
    assert "exit" in ran.kinds()
