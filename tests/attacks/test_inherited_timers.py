"""adl-exec started by a caller with an interval timer armed (`alarm(1)` or `setitimer`, then exec):
the timer survives exec and its signal ends the process by default, so adl-exec's supervisor died
while the agent ran and the session's end was never recorded. adl-exec disarms them first."""

from __future__ import annotations

import sys

import pytest

from ..helpers.sandbox import Sandbox, needs_root

TIMERS = {
    # fires while the agent runs
    "real": "signal.ITIMER_REAL, 1.0",
    # fires after a little CPU time: during the launch or while supervising
    "profiling": "signal.ITIMER_PROF, 0.05",
}


@needs_root
@pytest.mark.parametrize("timer", list(TIMERS))
def test_a_timer_armed_by_the_caller_does_not_end_the_supervisor(sandbox: Sandbox, timer: str) -> None:
    sandbox.wrap = [
        sys.executable,
        "-c",
        f"import os, signal, sys; signal.setitimer({TIMERS[timer]}); os.execv(sys.argv[1], sys.argv[1:])",
    ]
    ran = sandbox.python("import sys, time; time.sleep(2); print('ran'); sys.exit(7)")
    assert ran.code == 7, (ran.code, ran.err)
    assert ran.out.strip() == "ran"
    assert ran.kinds().count("exit") == 1
