"""adl-exec started by a caller with a CPU-time or file-size limit (RLIMIT_CPU, RLIMIT_FSIZE:
`ulimit -t`, `ulimit -f`): the limits survive exec. adl-exec's supervisor, which reads every kernel
denial of the session, was killed (SIGXCPU, then SIGKILL at the hard limit) by a flood of them; and
its audit records stopped at the file-size limit (EFBIG) while the agent ran, the session then
reported refused. Either way no exit record. The supervisor, the stage, init, the guardian and the
egress filter are the enforcer's: adl-exec lifts both limits for them and gives the caller's back to
the agent, whom they may be meant for. A hard limit it cannot lift refuses the launch, recorded.

The CPU flood comes from several agent processes, each well within the limit (it is per process),
so that only the supervisor, which reads them all, would exceed it."""

from __future__ import annotations

import json
import re
import resource
import sys

import pytest

from enforcer.cli.exec_common import EXIT_REFUSED

from ..helpers.sandbox import Result, Sandbox, needs_root

pytestmark = needs_root
CAP_SYS_RESOURCE = 24
INFINITY = str(resource.RLIM_INFINITY)

CPU_FLOOD = """
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

# Sixty distinct denials, each its own decision record: the log grows past the limit meanwhile.
RECORD_FLOOD = """
import resource, sys, time
for i in range(60):
    try:
        open({outside!r} + f"/f{{i}}.txt")
    except OSError:
        pass
time.sleep(0.5)
print("limit", *resource.getrlimit(resource.{name}), "children")
sys.exit(7)
"""
FSIZE = 30000  # past the launch's records, short of the session's


def _limited(name: str, soft: int, hard: int) -> list[str]:
    """A caller that sets resource limit `name`, then execs adl-exec."""
    code = f"import os, resource, sys; resource.setrlimit(resource.{name}, ({soft}, {hard}))"
    return [sys.executable, "-c", code + "; os.execv(sys.argv[1], sys.argv[1:])"]


def _may_raise_hard_limits() -> bool:
    with open("/proc/self/status") as f:
        effective = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    return bool(effective & (1 << CAP_SYS_RESOURCE))


def _flood(sandbox: Sandbox, name: str, printed: str | None = None) -> Result:
    """The agent's flood for limit `name`; it prints its own limit `printed` (default: `name`)."""
    if name == "RLIMIT_CPU":
        return sandbox.python(CPU_FLOOD.format(denied=str(sandbox.outside / "private.txt")))
    for i in range(60):
        (sandbox.outside / f"f{i}.txt").write_text("x")
    return sandbox.python(RECORD_FLOOD.format(outside=str(sandbox.outside), name=printed or name))


def _ran_under(ran: Result, name: str, limit: tuple[str, str]) -> None:
    assert ran.code == 7, (ran.code, ran.err[-2000:])
    children = ["0", "0", "0", "0"] if name == "RLIMIT_CPU" else []
    assert ran.out.split() == ["limit", *limit, "children", *children], ran.out
    assert ran.kinds().count("exit") == 1
    assert ran.record("exit")["payload"]["exit_code"] == 7


LIMITS = {"RLIMIT_CPU": 1, "RLIMIT_FSIZE": FSIZE}


@pytest.mark.parametrize("name", list(LIMITS))
def test_a_soft_limit_set_by_the_caller_binds_the_agent_not_the_supervisor(sandbox: Sandbox, name: str) -> None:
    """A soft limit alone is lifted without any privilege."""
    sandbox.wrap = _limited(name, LIMITS[name], resource.RLIM_INFINITY)
    _ran_under(_flood(sandbox, name), name, (str(LIMITS[name]), INFINITY))


@pytest.mark.parametrize("name", list(LIMITS))
def test_a_hard_limit_set_by_the_caller_binds_the_agent_or_the_launch_is_refused(sandbox: Sandbox, name: str) -> None:
    """A hard limit is lifted with CAP_SYS_RESOURCE; without it (a container's root may lack it),
    the launch is refused and recorded before anything runs, never cut short unrecorded."""
    sandbox.wrap = _limited(name, LIMITS[name], LIMITS[name])
    ran = _flood(sandbox, name)
    if _may_raise_hard_limits():
        _ran_under(ran, name, (str(LIMITS[name]), str(LIMITS[name])))
        return
    assert ran.code == EXIT_REFUSED, (ran.code, ran.err[-2000:])
    assert f"({name}, {LIMITS[name]} " in ran.err and "CAP_SYS_RESOURCE" in ran.err, ran.err
    assert ran.out == "" and "launch" not in ran.kinds() and "exit" not in ran.kinds()
    assert name in json.dumps(ran.record("refused")), ran.kinds()


def test_a_low_descriptor_limit_set_by_the_caller_binds_the_agent_not_the_supervisor(sandbox: Sandbox) -> None:
    """The soft RLIMIT_NOFILE: too low for the supervisor's kernel-denial reader, which opens modules
    and its netlink socket while the agent runs (the count was then reported incomplete), but the
    agent's to have."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    sandbox.wrap = _limited("RLIMIT_NOFILE", 14, hard)
    ran = _flood(sandbox, "RLIMIT_FSIZE", "RLIMIT_NOFILE")  # distinct denials, each read from the kernel
    assert ran.code == 7, (ran.code, ran.err[-2000:])
    assert ran.out.split() == ["limit", "14", str(hard), "children"], ran.out
    counted = re.search(r"kernel denials: (\d+)", ran.err)
    assert "Too many open files" not in ran.err and counted and int(counted[1]) >= 60, ran.err
    assert ran.kinds().count("exit") == 1


def test_a_refused_hard_limit_starts_nothing_with_a_network_either(sandbox: Sandbox) -> None:
    """With a network the session's launch record was written and its egress filter started (a root
    process, a namespace with its nftables rules, net.start and net.summary records) before the
    refusal, known since before the stage was forked, was read: the log then held an allowed launch
    that never ran. The caller here has no CAP_SYS_RESOURCE (dropped from its bounding set, so root's
    exec keeps none of it), whatever this host's root holds."""
    pr_capbset_drop = 24
    drop = f"import ctypes; assert ctypes.CDLL(None).prctl({pr_capbset_drop}, {CAP_SYS_RESOURCE}, 0, 0, 0) == 0; "
    limited = _limited("RLIMIT_CPU", 10, 10)
    sandbox.wrap = [*limited[:2], drop + limited[2]]
    sandbox.permissions["network"] = {"allowed_hosts": ["api.example.test"], "allowed_ports": [443]}
    ran = sandbox.python("print('ran')")
    assert ran.code == EXIT_REFUSED, (ran.code, ran.err[-2000:])
    assert "(RLIMIT_CPU, 10 " in ran.err and "CAP_SYS_RESOURCE" in ran.err, ran.err
    assert ran.out == "" and "RLIMIT_CPU" in json.dumps(ran.record("refused")), ran.kinds()
    assert not [kind for kind in ran.kinds() if kind in ("launch", "exit") or kind.startswith("net.")], ran.kinds()
