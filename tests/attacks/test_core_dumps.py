"""Core dumps from inside a real sandbox. The kernel writes a crashing process's core file itself
(core_pattern 'core': into the working directory), past the creation guard: the agent would create a
name a denied pattern matches, with content of its choosing, and fill the disk with its memory."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

PROBE = """
import os, resource
ws = os.environ["ALLOWED_WS"]
try:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    print("RAISED the hard limit")
except (OSError, ValueError) as exc:
    print("BLOCKED raising the hard limit", exc)
soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
pid = os.fork()
if pid == 0:
    os.chdir(ws)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))  # as high as it may go
    os.abort()
_, status = os.waitpid(pid, 0)
print("DUMPED" if os.WCOREDUMP(status) else "NO DUMP", "killed by", os.WTERMSIG(status))
print("CORE FILE" if os.path.lexists(os.path.join(ws, "core")) else "NO CORE FILE")
"""


def test_a_crashing_agent_writes_no_core_file(sandbox: Sandbox) -> None:
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|") or "/" in pattern.split("%")[0]:
        pytest.skip(f"core_pattern {pattern!r} writes no core file into the working directory")
    sandbox.permissions["filesystem"]["denied_paths"].append(f"{sandbox.ws}/**/core")
    result = sandbox.python(textwrap.dedent(PROBE), env={"ALLOWED_WS": str(sandbox.ws)})
    cores = [p for p in sandbox.ws.rglob("core*")]
    assert cores == [], f"a core file the guard never saw: {cores}\n{result.out}{result.err}"
    assert "NO DUMP killed by 6" in result.out, result.out + result.err
    assert "BLOCKED raising the hard limit" in result.out, result.out + result.err
    # control: the agent still creates ordinary names there
    ok = sandbox.python(f"open({str(sandbox.ws / 'made.txt')!r}, 'w').write('x')")
    assert ok.code == 0 and (sandbox.ws / "made.txt").exists(), ok.err
