"""The launch stage's module contract: light to import, its descriptor hygiene, and Stage.ready():
whether the future agent has announced itself, without waiting for it."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys

import pytest

from enforcer.sandbox.stage import Stage, close_all_but


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


def test_ready_once_the_future_agent_announced_itself_or_the_stage_is_gone() -> None:
    ours, theirs = socket.socketpair()
    stage = Stage(os.getpid(), ours, -1)
    try:
        assert not stage.ready()
        theirs.send(b"\0\0\0\0")
        assert stage.ready()
    finally:
        ours.close()
        theirs.close()
    ours, theirs = socket.socketpair()
    theirs.close()  # a stage that died: send() then fails at once
    try:
        assert Stage(os.getpid(), ours, -1).ready()
    finally:
        ours.close()


def test_ready_on_a_socket_numbered_above_1023() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1100:
        pytest.skip("descriptors above 1023 are not allowed here")
    if soft != resource.RLIM_INFINITY and soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1100, hard))
    ours, theirs = socket.socketpair()
    high = socket.socket(fileno=os.dup2(ours.fileno(), 1050))
    ours.close()
    try:
        stage = Stage(os.getpid(), high, -1)
        assert not stage.ready()
        theirs.send(b"\0\0\0\0")
        assert stage.ready()
    finally:
        high.close()
        theirs.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
