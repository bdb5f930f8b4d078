"""The launch stage's module contract: light to import, and its descriptor hygiene."""

from __future__ import annotations

import os
import subprocess
import sys

from enforcer.sandbox.stage import close_all_but


def test_adl_exec_forks_its_stage_before_the_policy_code_is_loaded() -> None:
    # adl-exec imports enforcer.cli.exec, then forks the stage: nothing heavy may be loaded by then.
    code = (
        "import sys, enforcer.cli.exec, enforcer.sandbox.stage\n"
        "heavy = ('enforcer.policy.compiler', 'enforcer.policy.model', 'enforcer.audit', 'jsonschema_rs',"
        " 'pydantic', 'ruamel', 'cryptography', 'pyseccomp', 'grpc')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def testclose_all_but_keeps_exactly_the_given_descriptors() -> None:
    read_end, write_end = os.pipe()
    extra = os.dup(read_end)
    pid = os.fork()
    if pid == 0:
        try:
            close_all_but({0, 1, 2, write_end})
            open_fds = {int(fd) for fd in os.listdir("/proc/self/fd")}
            ok = {0, 1, 2, write_end} <= open_fds and read_end not in open_fds and extra not in open_fds
            os.write(write_end, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 2) == b"ok"
    os.close(read_end)
    os.close(extra)
