"""adl-exec started by a caller that leaves many descriptors open across its exec (inheritable, as
a shell's or a build tool's may be): adl-exec lifts its soft RLIMIT_NOFILE, so what it opens next is
numbered above 1023, which select() cannot watch. The launch stage waited on its order socket with
select() and died (ValueError) before the agent started, the launch refused; the session's
kernel-denial reader did the same while the agent ran. Both wait with poll() now. The agent gets
none of those descriptors (the stage closes all but its stdio)."""

from __future__ import annotations

import re
import resource
import sys

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

HELD = 1100  # past select()'s FD_SETSIZE of 1024

AGENT = """
import os, sys
try:
    open({denied!r})
except OSError as exc:
    print("denied", exc.errno)
print("fds", len(os.listdir("/proc/self/fd")))
sys.exit(7)
"""


def test_a_caller_holding_many_descriptors_still_gets_a_supervised_session(sandbox: Sandbox) -> None:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard < HELD + 200:
        raise AssertionError(f"this host's hard descriptor limit ({hard}) is below what the test needs")
    code = (
        f"import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, ({HELD + 20}, {hard})); "
        f"[os.set_inheritable(os.open('/dev/null', os.O_RDONLY), True) for _ in range({HELD})]; "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    sandbox.wrap = [sys.executable, "-c", code]
    ran = sandbox.python(AGENT.format(denied=str(sandbox.outside / "private.txt")))
    assert ran.code == 7, (ran.code, ran.err[-2000:])
    assert "denied 13" in ran.out, ran.out
    assert int(ran.out.split("fds ")[1].split()[0]) < 10, ran.out  # stdio and the listing's own
    counted = re.search(r"kernel denials: (\d+)", ran.err)
    assert counted and int(counted[1]) >= 1 and "select" not in ran.err, ran.err
    assert ran.kinds().count("exit") == 1
    assert ran.record("exit")["payload"]["kernel_denials"].get("available", True), ran.record("exit")["payload"]
