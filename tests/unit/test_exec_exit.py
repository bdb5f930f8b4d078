"""adl-exec's exit once the launch is over (enforcer.cli.exec.end_command): at once, without the
interpreter's teardown, but with everything a normal exit does that its caller can see."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import IO

EXAMPLE = {
    "adl_spec": "0.3.0",
    "name": "Exit",
    "description": "runs /bin/true",
    "version": "1.0.0",
    "data_classification": {"sensitivity": "internal"},
    "permissions": {"execution": {"allowed_commands": ["true"], "allow_shell": False}},
}


def _run(
    body: str, stdout: int | IO[str] = subprocess.PIPE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(
        """
        import atexit, sys
        from enforcer.cli.exec import end_command

        class Teardown:
            def __del__(self):  # runs only in the interpreter's teardown
                print("teardown ran", flush=True)

        held = Teardown()
        """
    ) + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=60, env=env
    )


def test_exits_with_the_code_after_the_atexit_callbacks_and_the_buffered_output() -> None:
    proc = _run(
        """
        atexit.register(lambda: print("atexit ran"))
        print("buffered output")  # a pipe: block-buffered, still in the buffer here
        sys.stderr.write("no newline")
        end_command(7)
        print("not reached")
        """
    )
    assert proc.returncode == 7
    assert proc.stdout == "buffered output\natexit ran\n"  # no teardown: the object's __del__ never ran
    assert proc.stderr == "no newline"


def test_a_thread_still_running_gets_the_normal_exit() -> None:
    proc = _run(
        """
        import threading, time
        started = threading.Event()

        def late():
            started.set()
            time.sleep(0.3)
            print("thread finished", flush=True)

        threading.Thread(target=late).start()
        started.wait()
        sys.exit(end_command(3))
        """
    )
    assert proc.returncode == 3
    # The normal exit waited for the thread, then tore the interpreter down.
    assert proc.stdout == "thread finished\nteardown ran\n"


def test_a_failed_flush_gets_the_normal_exit_and_its_status() -> None:
    def exit_status(ending: str) -> tuple[int, bool]:
        with open("/dev/full", "w") as full:  # every write fails with ENOSPC
            proc = _run(f"print('lost')\nsys.exit({ending})\n", stdout=full)
        return proc.returncode, "No space left on device" in proc.stderr

    normal = exit_status("0")
    assert normal[0] != 0 and normal[1]  # Python reports a lost output, with a failing status
    assert exit_status("end_command(0)") == normal


def test_adl_exec_as_the_command_ends_through_it(tmp_path: Path) -> None:
    policy = tmp_path / "agent.adl.json"
    policy.write_text(json.dumps(EXAMPLE))
    proc = _run(
        f"""
        sys.argv = ["adl-exec", "--adl", {str(policy)!r}, "--explain", "--", "/bin/true"]
        from enforcer.cli.exec import main
        main()
        print("not reached")
        """,
        env={**os.environ, "ADL_ENFORCER_CACHE_DIR": "off", "ADL_ENFORCER_AUDIT_DIR": str(tmp_path / "audit")},
    )
    assert proc.returncode == 0, proc.stderr
    assert "layers:" in proc.stdout  # the explanation, flushed
    assert "not reached" not in proc.stdout and "teardown ran" not in proc.stdout


def test_an_embedded_launch_freezes_what_it_shares_with_the_stage(tmp_path: Path) -> None:
    """The objects that exist when the stage is forked are frozen first (gc.freeze): this process's
    collections then never write to them, so the pages the stage and the session's init share with it
    stay shared."""
    proc = _run(
        f"""
        import gc
        from unittest import mock
        from enforcer.cli import exec as exec_cli

        seen = []

        def prepare(session, cgroup_group, **_limits):
            seen.append(gc.get_freeze_count())
            return None

        with mock.patch("enforcer.sandbox.stage.prepare", prepare), \\
                mock.patch("enforcer.cli.exec_embedded.run_embedded", lambda *a: 0):
            code = exec_cli.main(["--adl", {str(tmp_path / "a.json")!r}, "--", "true"])
        print(code, seen[0] > 1000)
        """,
        env={**{k: v for k, v in os.environ.items() if k != "ADL_ENFORCER_ADDR"}, "ADL_ENFORCER_CACHE_DIR": "off"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 True"
