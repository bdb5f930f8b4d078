"""Kernel denials (Landlock, seccomp) of a real sandbox reach the session's audit log as decision
records naming the object, the right, the process and the rule; a flood stays bounded."""

from __future__ import annotations

import glob
import json
import os
import time
from typing import Any

import pytest

from ..helpers.daemon import RunningDaemon
from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root


def kernel_denials(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r["payload"]
        for r in records
        if (r["intent"] == "adl.enforcer.decision" and str(r["payload"].get("enforced_by", "")).endswith("kernel)"))
        or r["payload"].get("rules") == ["kernel.denials_summary"]
    ]


def test_a_landlock_read_denial_is_recorded_with_path_right_pid_command_and_rule(sandbox: Sandbox) -> None:
    target = sandbox.outside / "private.txt"
    r = sandbox.run("cat", str(target))
    assert r.code == 1 and "Permission denied" in r.err
    found = [d for d in kernel_denials(r.records) if d.get("path") == str(target)]
    assert len(found) == 1, r.records
    denial = found[0]
    assert denial["mechanism"] == "landlock" and denial["blockers"] == ["fs.read_file"]
    assert denial["access"] == "read" and denial["command"] == "cat" and denial["exe"].endswith("/cat")
    assert isinstance(denial["pid"], int) and denial["pid"] > 0
    assert denial["rules"] == ["fs.not_allowed"] and denial["reasons"][0]["pointer"].endswith("/allowed_paths")
    assert denial["grant"] == {
        "pointer": "/permissions/filesystem/allowed_paths/-",
        "value": {"path": str(target), "access": "read"},
    }
    launch = r.record("launch")
    assert all(rec["corr"] == launch["corr"] for rec in r.records if rec["payload"] is denial)
    exit_record = r.record("exit")["payload"]
    assert exit_record["kernel_denials"]["available"] and exit_record["kernel_denials"]["denials"] >= 1
    # --report names it and says where the log is
    assert str(target) in r.err and "kernel denials:" in r.err and str(sandbox.audit) in r.err


def _executable_library() -> str:
    """An executable file the agent's mounts let run but its Landlock rules do not: a command
    elsewhere is stopped by its noexec mount first, which the kernel does not report."""
    for path in sorted(glob.glob("/usr/lib/*-linux-gnu*/libc.so.6")):
        if os.access(path, os.X_OK):
            return path
    pytest.skip("no executable libc.so.6 in a library directory")


def test_exec_and_write_denials_name_their_rule(sandbox: Sandbox) -> None:
    library = _executable_library()
    code = (
        "import os, subprocess\n"
        f"try: open({str(sandbox.ref / 'x.txt')!r}, 'w')\n"
        "except PermissionError: print('write denied')\n"
        f"try: subprocess.run([{library!r}])\n"
        "except PermissionError: print('exec denied')\n"
    )
    r = sandbox.python(code)
    assert r.code == 0 and "write denied" in r.out and "exec denied" in r.out, r.err
    denials = kernel_denials(r.records)
    # Creating a file is a right on its directory: the kernel names the directory.
    write = next(d for d in denials if d.get("path") == str(sandbox.ref))
    assert write["access"] == "write" and "fs.make_reg" in write["blockers"]
    assert write["rules"] == ["fs.mode_not_allowed"]  # the reference directory is granted read only
    execute = next(d for d in denials if d.get("path") == library)  # from a child that is gone by now
    assert execute["access"] == "execute" and "fs.execute" in execute["blockers"]
    assert execute["rules"] == ["exec.not_allowed"]
    assert execute["grant"]["pointer"] == "/permissions/execution/allowed_commands/-"


def test_a_seccomp_denial_is_recorded_with_its_syscall(sandbox: Sandbox) -> None:
    code = "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nprint(libc.syscall(425, 8, 0))\n"
    r = sandbox.python(code)  # io_uring_setup
    assert r.code == 0 and r.out.strip() == "-1"
    seccomp = [d for d in kernel_denials(r.records) if d.get("mechanism") == "seccomp"]
    denial = next(d for d in seccomp if d["syscall"] == "io_uring_setup")
    assert denial["command"] == "python3" and denial["pid"] > 0
    assert denial["rules"] == ["sandbox.seccomp"] and denial["grant"] is None


def test_a_flood_of_denials_is_summarised_within_a_bound_and_the_session_is_unharmed(sandbox: Sandbox) -> None:
    n = 100_000
    for i in range(300):  # more distinct objects than are ever recorded one by one
        (sandbox.outside / f"f{i}").write_text("x")
    code = (
        "import os\n"
        f"d = 0\n"
        f"for i in range({n}):\n"
        f"    try: os.open({str(sandbox.outside)!r} + '/f' + str(i % 300), os.O_RDONLY)\n"
        "    except PermissionError: d += 1\n"
        f"open({str(sandbox.ws / 'done.txt')!r}, 'w').write(str(d))\n"
        "print(d)\n"
    )
    limits = {"max_memory_mb": 64, "max_cpu_percent": 100, "max_duration_sec": 120}
    policy = sandbox.policy(permissions={"resource_limits": limits})
    started = time.monotonic()
    r = sandbox.python(code, timeout=240, policy=policy)
    elapsed = time.monotonic() - started
    assert r.code == 0 and r.out.strip() == str(n), r.err
    assert (sandbox.ws / "done.txt").read_text() == str(n)
    denials = kernel_denials(r.records)
    one_by_one = [d for d in denials if "summary" not in d]
    summaries = [d for d in denials if "summary" in d]
    assert 0 < len(one_by_one) <= 256
    assert summaries and summaries[-1]["summary"] == "final"
    final = summaries[-1]
    # Every denial is counted: read one by one, or lost in a full socket buffer and counted as such.
    assert final["denials"] > 0 and final["denials"] <= n
    assert final["denials"] == n or final["lost_in_kernel_socket"] + final["lost_in_kernel_queue"] > 0, final
    assert len(json.dumps(final)) < 16_000
    written = sum(len(json.dumps(rec)) for rec in r.records)
    assert written < 1_000_000, written
    print(f"flood: {final['denials']} denials read in {elapsed:.1f} s, {len(one_by_one)} recorded, {written} bytes")


def test_daemon_sessions_record_kernel_denials_and_report_them(daemon: RunningDaemon) -> None:
    target = str(daemon.box.outside / "private.txt")  # the agent's uid may read it, its policy not
    r = daemon.adl_exec("cat", target)
    assert r.returncode == 1 and "kernel denials:" in r.stderr and target in r.stderr, r.stderr
    found = [d for d in kernel_denials(daemon.records()) if d.get("path") == target]
    assert len(found) == 1 and found[0]["command"] == "cat" and found[0]["rules"] == ["fs.not_allowed"]


def test_a_denial_made_as_the_agent_exits_is_recorded_every_time(sandbox: Sandbox) -> None:
    # The reader stops as soon as the kernel has delivered what was queued before the session
    # ended: a denial in the agent's last instant is among it, in every session.
    target = sandbox.outside / "last.txt"
    target.write_text("x")
    code = f"import os\ntry: os.open({str(target)!r}, os.O_RDONLY)\nexcept PermissionError: os._exit(3)\nos._exit(0)\n"
    for _ in range(3):
        r = sandbox.python(code)
        assert r.code == 3, r.err
        found = [d for d in kernel_denials(r.records) if d.get("path") == str(target)]
        assert len(found) == 1 and found[0]["blockers"] == ["fs.read_file"], r.records
        assert r.record("exit")["payload"]["kernel_denials"]["denials"] >= 1
