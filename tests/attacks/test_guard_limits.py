"""The creation guard runs with the agent's uid in the agent's PID namespace, so the kernel lets the
agent prlimit it (same real, effective and saved ids; Landlock scopes signals and tracing, not
resource limits). RLIMIT_NOFILE 0 made it refuse every creation with EMFILE, RLIMIT_AS or
RLIMIT_CPU ended it: a way to stop the guard that its signal scope was meant to close. Its
process and threads get a filter of their own in the agent: prlimit with a new limit on one of
them is refused (EPERM); reading their limits, and setting those of the agent's own processes,
still work."""

from __future__ import annotations

import textwrap

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

ATTACK = """
import errno, os, resource, subprocess
me = os.getpid()
child = subprocess.Popen(["python3", "-c", "import time; time.sleep(30)"])
lowered, refused, read = [], 0, 0
for pid in range(1, child.pid):  # every process and thread of the session started before the agent's child
    if pid == me:
        continue
    for name, new in (("NOFILE", (0, 0)), ("AS", (1 << 20, 1 << 20)), ("CPU", (1, 1)), ("STACK", (4096, 4096))):
        which = getattr(resource, "RLIMIT_" + name)
        try:
            resource.prlimit(pid, which)
            read += 1
            resource.prlimit(pid, which, new)
            lowered.append((pid, name))
        except ProcessLookupError:
            break
        except PermissionError:
            refused += 1
# The raw call, with garbage above the 32 bits of the pid the kernel reads.
import ctypes, platform
libc = ctypes.CDLL(None, use_errno=True)
zero = (ctypes.c_ulong * 2)(0, 0)
nr = {"x86_64": 302, "aarch64": 261}[platform.machine()]
answers = set()
for pid in range(3, child.pid):
    done = libc.syscall(nr, ctypes.c_long(pid | 1 << 32), resource.RLIMIT_NOFILE, zero, None) == 0
    answers.add("set" if done else errno.errorcode[ctypes.get_errno()])
print("raw", *sorted(answers))
resource.prlimit(child.pid, resource.RLIMIT_CPU, (5, 5))  # its own child: still the agent's to limit
print("child", resource.prlimit(child.pid, resource.RLIMIT_CPU))
child.kill()
child.wait()
def create(path):
    try:
        open(path, "w").write("x")
        return "created"
    except OSError as exc:
        return f"errno {exc.errno}"
print("lowered", lowered, "refused", refused, "read", read)
print("txt", create(WS + "/after.txt"), "pem", create(WS + "/after.pem"))
"""


def test_the_agent_cannot_lower_the_creation_guards_limits(sandbox: Sandbox) -> None:
    ws = str(sandbox.ws)
    result = sandbox.python(f"WS = {ws!r}\n" + textwrap.dedent(ATTACK))
    assert result.code == 0, result.err[-2000:]
    assert "lowered [] " in result.out, result.out
    # init (root) and the guard's process and thread at least, four limits each
    assert int(result.out.split("refused ")[1].split()[0]) >= 12, result.out
    assert int(result.out.split("read ")[1].split()[0]) >= 8, result.out  # the guard's limits stay readable
    assert "child (5, 5)" in result.out, result.out
    raw = result.out.split("raw ")[1].split("\n")[0].split()
    assert "EPERM" in raw and set(raw) <= {"EPERM", "ESRCH"}, result.out  # ESRCH: the guard's forker, gone
    assert "txt created pem errno 13" in result.out, result.out + result.err
    assert (sandbox.ws / "after.txt").exists() and not (sandbox.ws / "after.pem").exists()
    assert "launch" in result.kinds() and result.kinds().count("exit") == 1
    assert "prlimit64" in result.err, result.err  # each refusal is a kernel denial, reported
