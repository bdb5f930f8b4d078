"""adl-exec started by a caller with a CPU-time limit (RLIMIT_CPU, `ulimit -t`): the limit survives
exec, and adl-exec's supervisor, which reads every kernel denial of the session, was killed (SIGXCPU,
then SIGKILL at the hard limit) by a flood of them: no exit record, and the agent ended by its
parent-death signal. The supervisor, the stage, init and the guardian are the enforcer's: adl-exec
lifts the limit for them and gives the caller's back to the agent, whom it may be meant for.

The flood comes from several agent processes, each well within the limit (it is per process), so
that only the supervisor, which reads them all, would exceed it."""

from __future__ import annotations

import json
import resource
import sys

from enforcer.cli.exec_common import EXIT_REFUSED

from ..helpers.sandbox import Result, Sandbox, needs_root

CAP_SYS_RESOURCE = 24

FLOOD = """
import os, resource, sys, time
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        deadline = time.monotonic() + 4
        while time.process_time() < 0.6 and time.monotonic() < deadline:  # its own CPU: under the limit
            try:
                open({denied!r})
            except OSError:
                pass
        os._exit(0)
    children.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children]
print("limit", *resource.getrlimit(resource.RLIMIT_CPU), "children", *codes)
sys.exit(7)
"""


def _limited(soft: int, hard: int) -> list[str]:
    """A caller that sets RLIMIT_CPU, then execs adl-exec."""
    code = f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_CPU, ({soft}, {hard}))"
    return [sys.executable, "-c", code + "; os.execv(sys.argv[1], sys.argv[1:])"]


def _may_raise_hard_limits() -> bool:
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(effective & (1 << CAP_SYS_RESOURCE))


def _flood(sandbox: Sandbox) -> Result:
    return sandbox.python(FLOOD.format(denied=str(sandbox.outside / "private.txt")))


def _ran_under(ran: Result, limit: tuple[str, str]) -> None:
    assert ran.code == 7, (ran.code, ran.err[-2000:])
    assert ran.out.split() == ["limit", *limit, "children", "0", "0", "0", "0"], ran.out
    assert ran.kinds().count("exit") == 1
    assert ran.record("exit")["payload"]["exit_code"] == 7


@needs_root
def test_a_soft_cpu_limit_set_by_the_caller_binds_the_agent_not_the_supervisor(sandbox: Sandbox) -> None:
    """A soft limit alone (SIGXCPU) is lifted without any privilege."""
    sandbox.wrap = _limited(1, resource.RLIM_INFINITY)
    _ran_under(_flood(sandbox), ("1", str(resource.RLIM_INFINITY)))


@needs_root
def test_a_hard_cpu_limit_set_by_the_caller_binds_the_agent_or_the_launch_is_refused(sandbox: Sandbox) -> None:
    """A hard limit (SIGKILL) is lifted with CAP_SYS_RESOURCE; without it (a container's root may
    lack it), the launch is refused and recorded before anything runs, never cut short unrecorded."""
    sandbox.wrap = _limited(1, 1)
    ran = _flood(sandbox)
    if _may_raise_hard_limits():
        _ran_under(ran, ("1", "1"))
        return
    assert ran.code == EXIT_REFUSED, (ran.code, ran.err[-2000:])
    assert "hard CPU-time limit (RLIMIT_CPU, 1 s)" in ran.err and "CAP_SYS_RESOURCE" in ran.err, ran.err
    assert ran.out == "" and "launch" not in ran.kinds() and "exit" not in ran.kinds()
    assert "RLIMIT_CPU" in json.dumps(ran.record("refused")), ran.kinds()
