"""The egress filter's process ties its life to its launcher (adl-exec, a daemon session's
supervisor) with a parent-death signal, set in the filter after the fork. A launcher that dies
before that (SIGKILL by root, the OOM killer) leaves the signal tied to whichever process adopted the
filter: the filter must then end at once, creating nothing (no namespace, no listener), as the
session's init does (pidns.die_with)."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from pathlib import Path

from enforcer.audit import WriterSettings
from enforcer.egress import netns, process
from enforcer.egress_values import EgressValues
from enforcer.policy import SchemaSet

from ..helpers.documents import base_adl, compile_doc
from ..helpers.processes import alive
from ..helpers.sandbox import needs_root

pytestmark = needs_root


def test_a_filter_whose_launcher_died_before_it_started_ends_creating_nothing(
    schemas: SchemaSet, tmp_path: Path
) -> None:
    policy = compile_doc(schemas, base_adl())
    created = tmp_path / "created"
    report_read, report_write = os.pipe()
    launcher = os.fork()
    if launcher == 0:
        try:
            os.close(report_read)
            fork = os.fork

            def held_fork() -> int:
                """The filter, right after its fork, held until its launcher is gone."""
                pid = fork()
                if pid == 0:
                    parent = os.getppid()
                    os.write(report_write, f"filter {os.getpid()}\n".encode())
                    while os.getppid() == parent:
                        time.sleep(0.01)
                return pid

            def create() -> None:
                created.touch()  # a file: the filter has closed every descriptor but its own by now
                os._exit(0)  # never a real namespace here: what matters is that it got this far

            os.fork = held_fork  # type: ignore[assignment]
            netns.create = create  # type: ignore[assignment]
            audit = process.AuditTarget(tmp_path / "log", tmp_path / "key.pem", WriterSettings())
            process.start(policy, EgressValues(), audit, "session-test")
        finally:
            os._exit(1)
    os.close(report_write)
    filter_pid = None
    try:
        assert select.select([report_read], [], [], 20)[0], "the filter was not forked"
        line = os.read(report_read, 64).split(b"\n")[0]
        assert line.startswith(b"filter "), line
        filter_pid = int(line.split()[1])
        os.kill(launcher, signal.SIGKILL)
        os.waitpid(launcher, 0)
        deadline = time.monotonic() + 10
        while alive(filter_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not alive(filter_pid), "the filter did not end"
        assert not created.exists(), "the filter went on without its launcher"
    finally:
        if filter_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(filter_pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(launcher, 0)
        os.close(report_read)
