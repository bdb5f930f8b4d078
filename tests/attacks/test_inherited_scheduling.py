"""adl-exec started under a real-time scheduling policy (`chrt -f 1 adl-exec ...`): the policy
survives fork and exec, and the cgroup's cpu.max, which enforces max_cpu_percent, throttles only
normal tasks. Where the kernel lets a real-time task join the session's cgroup, the agent runs
unthrottled (a busy loop takes a whole CPU, up to the host's real-time share); where it does not
(CONFIG_RT_GROUP_SCHED), the launch was refused with "join cgroup: Invalid argument". The session's
processes (stage, init, guard, agent) are forked under the normal policy; adl-exec itself keeps the
caller's."""

from __future__ import annotations

import os
import sys

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

AGENT = """
import os, time
started = time.monotonic()
while time.monotonic() - started < 0.6:
    pass
wall = time.monotonic() - started
print("policy", os.sched_getscheduler(0), "cpu", time.process_time(), "wall", wall)
"""


def test_a_real_time_caller_gets_a_throttled_agent(sandbox: Sandbox) -> None:
    code = (
        f"import os, sys; os.sched_setscheduler(0, {os.SCHED_FIFO}, os.sched_param(1)); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    sandbox.wrap = [sys.executable, "-c", code]
    ran = sandbox.python(AGENT)  # the sandbox's policy: max_cpu_percent 20
    assert ran.code == 0, (ran.code, ran.err[-2000:])
    _, policy, _, cpu, _, wall = ran.out.split()
    assert int(policy) == os.SCHED_OTHER, ran.out
    # 20 % of a CPU, and the interpreter's start before the loop: far from the whole CPU of an
    # unthrottled loop.
    assert float(cpu) < 0.5 * float(wall), ran.out
    assert ran.kinds().count("exit") == 1
