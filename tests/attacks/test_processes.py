"""The agent sees and reaches only its own session's processes: no host pid can be signalled,
prlimit'ed or looked up, the launcher's and guardian's limits are out of reach, /proc shows the
session only, and the session always ends on time with its exit record and no cgroup left."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..helpers.sandbox import AGENT_GID, AGENT_UID, Result, Sandbox, needs_root, session_cgroups

pytestmark = needs_root

PROBE = """
import errno, os, resource
def check(label, fn):
    try:
        fn()
        print("ESCAPED", label, flush=True)
    except OSError as exc:
        print("BLOCKED", label, errno.errorcode.get(exc.errno, exc.errno), flush=True)
"""


def attempt(box: Sandbox, code: str, **kw: object) -> Result:
    result = box.python(PROBE + textwrap.dedent(code), **kw)  # type: ignore[arg-type]
    assert "launch" in result.kinds() and "exit" in result.kinds(), result.err
    return result


@pytest.fixture
def host_sleepers() -> Iterator[dict[str, int]]:
    """Two host processes outside any session: one of root, one of the agent's own uid."""
    procs = {
        "root": subprocess.Popen(["sleep", "60"]),
        "same-uid": subprocess.Popen(
            ["setpriv", f"--reuid={AGENT_UID}", f"--regid={AGENT_GID}", "--clear-groups", "sleep", "60"]
        ),
    }
    try:
        yield {name: p.pid for name, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


def _cpu_limit(pid: int) -> str:
    line = next(x for x in Path(f"/proc/{pid}/limits").read_text().splitlines() if x.startswith("Max cpu time"))
    return " ".join(line.split()[3:5])


def test_host_processes_cannot_be_seen_or_reached(sandbox: Sandbox, host_sleepers: dict[str, int]) -> None:
    targets = {**host_sleepers, "test": os.getpid()}
    result = attempt(
        sandbox,
        f"""
        for name, pid in {targets!r}.items():
            check(f"kill {{name}}", lambda: os.kill(pid, 0))
            check(f"prlimit read {{name}}", lambda: resource.prlimit(pid, resource.RLIMIT_CPU))
            if name != "test":  # a CPU limit of 1 s is harmless to a sleeper, not to this test
                check(f"prlimit {{name}}", lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))
            check(f"getpriority {{name}}", lambda: os.getpriority(os.PRIO_PROCESS, pid))
            check(f"affinity {{name}}", lambda: os.sched_getaffinity(pid))
            check(f"pidfd {{name}}", lambda: os.close(os.pidfd_open(pid)))
            check(f"proc {{name}}", lambda: open(f"/proc/{{pid}}/cmdline").read())
        """,
    )
    lines = [line for line in result.out.splitlines() if line.startswith(("BLOCKED", "ESCAPED"))]
    assert len(lines) == 7 * len(targets) - 1 and "ESCAPED" not in result.out, result.out + result.err
    # ESRCH/ENOENT: the pid does not exist in the agent's namespace (EPERM would mean it was seen)
    assert all(line.split()[-1] in ("ESRCH", "ENOENT") for line in lines), result.out
    for pid in host_sleepers.values():
        assert _cpu_limit(pid) == "unlimited unlimited"
        os.kill(pid, 0)  # alive


def test_control_the_agent_manages_its_own_processes(sandbox: Sandbox) -> None:
    result = attempt(
        sandbox,
        f"""
        import signal, subprocess
        child = subprocess.Popen(["python3", "-c", "import time; time.sleep(30)"])
        resource.prlimit(child.pid, resource.RLIMIT_CPU, (5, 5))
        print("limit", resource.prlimit(child.pid, resource.RLIMIT_CPU))
        os.kill(child.pid, signal.SIGTERM)
        print("child", child.wait(), "ls", subprocess.run(["ls", {str(sandbox.ws)!r}], capture_output=True).returncode)
        print("pids", os.getpid(), os.getppid())
        """,
    )
    assert result.code == 0, result.err
    assert f"child -{signal.SIGTERM} ls 0" in result.out and "limit (5, 5)" in result.out, result.out
    pid, parent = map(int, result.out.split("pids")[1].split())
    assert (pid, parent) == (2, 1)  # the agent is its namespace's second process, under its init


def test_launcher_and_guardian_limits_are_out_of_reach(sandbox: Sandbox) -> None:
    """RLIMIT_NOFILE and RLIMIT_NPROC 0 on the launcher (the agent's parent) and the guardian (forked
    just before the stage), then a double fork: the deadline must still end the session, adl-exec must report
    it (no traceback), the log must hold the exit, and nothing may be left."""
    lock = sandbox.ws / "gc.lock"
    policy = sandbox.policy(permissions={**sandbox.permissions, "resource_limits": {"max_duration_sec": 2}})
    started = time.monotonic()
    result = attempt(
        sandbox,
        f"""
        import fcntl, time
        for label, pid in (("parent", os.getppid()), ("guardian", os.getpid() - 1)):
            check(label, lambda: resource.prlimit(pid, resource.RLIMIT_NOFILE, (0, 0)))
            check(label, lambda: resource.prlimit(pid, resource.RLIMIT_NPROC, (0, 0)))
        lock = open({str(lock)!r}, "w")
        resource.setrlimit(resource.RLIMIT_NOFILE, (0, 0))
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                fcntl.flock(lock, fcntl.LOCK_EX); lock.write("held"); lock.flush()
                time.sleep(60)
            os._exit(0)
        time.sleep(60)
        """,
        policy=policy,
        timeout=60,
    )
    assert "ESCAPED" not in result.out and result.out.count("BLOCKED") == 4, result.out + result.err
    assert "Traceback" not in result.err, result.err
    assert result.code == 128 + signal.SIGKILL and result.record("exit")["payload"]["reason"] == "timeout"
    assert time.monotonic() - started < 20
    assert lock.read_text() == "held"  # the grandchild ran
    with lock.open() as f:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError while the grandchild lives
    assert session_cgroups(sandbox.group) == []


def test_proc_shows_the_session_only(sandbox: Sandbox) -> None:
    """/proc is the session's: no host pid, no mount table (it names host paths outside the grants
    and every masked denied path), not through a thread's entry either."""
    result = attempt(
        sandbox,
        """
        import threading
        def read(path):
            try:
                return open(path).read()
            except OSError as exc:
                return f"error {exc.errno}"
        tables = {}
        for name in ("mountinfo", "mounts", "mountstats"):
            tables[name] = read(f"/proc/self/{name}")
            tables["thread-self " + name] = read(f"/proc/thread-self/{name}")
        def in_thread():
            tid = threading.get_native_id()
            tables["task"] = read(f"/proc/self/task/{tid}/mountinfo")
            tables["tid"] = read(f"/proc/{tid}/mountinfo")
        t = threading.Thread(target=in_thread); t.start(); t.join()
        for label, text in tables.items():
            print("TABLE", label, "LEAK" if "secret.txt" in text or " / " in text else "none")
        print("NSpid", [l for l in open("/proc/self/status") if l.startswith("NSpid")][0].split()[1:])
        """,
    )
    assert result.code == 0, result.err
    tables = [line for line in result.out.splitlines() if line.startswith("TABLE")]
    assert len(tables) == 8 and all(line.endswith(" none") for line in tables), result.out
    assert "NSpid ['2']" in result.out, result.out


def test_no_mount_table_through_statmount_or_listmount(sandbox: Sandbox) -> None:
    """listmount and statmount (Linux 6.8+) give what the masked /proc mount tables would: every
    mount point, masked denied paths and host paths outside the grants included."""
    result = attempt(
        sandbox,
        """
        import ctypes, struct
        libc = ctypes.CDLL(None, use_errno=True)
        def call(label, number, *args):
            def fn():
                if libc.syscall(number, *args) < 0:
                    raise OSError(ctypes.get_errno(), label)
            check(label, fn)
        ROOT, POINT = 0xFFFFFFFFFFFFFFFF, 0x10  # LSMT_ROOT; STATMOUNT_MNT_POINT
        ids = (ctypes.c_uint64 * 64)()
        call("listmount", 458, struct.pack("=IIQQQ", 32, 0, ROOT, 0, 0), ids, ctypes.c_size_t(64), ctypes.c_uint(0))
        out = ctypes.create_string_buffer(4096)
        own = struct.pack("=IIQQQ", 32, 0, ids[0] or 1, POINT, 0)
        call("statmount", 457, own, out, ctypes.c_size_t(4096), ctypes.c_uint(0))
        call("open_tree_attr", 467, -100, b"/", ctypes.c_uint(1), None, ctypes.c_size_t(0))
        print("LEAK" if b"secret.txt" in out.raw else "no names", flush=True)
        """,
    )
    assert result.code == 0, result.err
    assert "ESCAPED" not in result.out and result.out.count("BLOCKED") == 3, result.out + result.err
    assert "BLOCKED listmount EPERM" in result.out and "BLOCKED statmount EPERM" in result.out, result.out
    assert "no names" in result.out, result.out


def test_control_reading_the_agents_own_proc_entries(sandbox: Sandbox) -> None:
    result = attempt(
        sandbox,
        """
        print(open("/proc/self/status").read().splitlines()[0])
        print(sorted(os.listdir("/proc/self/fd")))
        print(open("/proc/self/cmdline").read().split("\\0")[0])
        print(open("/proc/net/dev").read().count("lo:"))
        """,
    )
    assert result.code == 0, result.err
    assert result.out.splitlines() == ["Name:\tpython3", "['0', '1', '2', '3']", "python3", "1"], result.out


def test_no_host_process_reachable_through_the_creation_guard(sandbox: Sandbox, host_sleepers: dict[str, int]) -> None:
    """An O_PATH descriptor needs no Landlock right, and reopening it through /proc/self/fd with
    O_CREAT hands the open to the creation guard. Whatever the guard's rights, the /proc it sees is
    the session's: a host process's command line and its network namespace's sockets do not exist."""
    with socket.create_server(("127.0.0.1", 0)) as listener:  # a host socket to look for
        port = listener.getsockname()[1]
        host_pid = host_sleepers["root"]
        result = attempt(
            sandbox,
            f"""
            for label, path in (("cmdline", "/proc/{host_pid}/cmdline"), ("tcp", "/proc/{host_pid}/net/tcp")):
                def reopen():
                    fd = os.open(path, os.O_PATH)
                    data = os.read(os.open(f"/proc/self/fd/{{fd}}", os.O_RDONLY | os.O_CREAT), 65536)
                    print("READ", label, data.hex())
                check(label, reopen)
            """,
        )
    assert result.out.count("BLOCKED") == 2 and "ESCAPED" not in result.out, result.out + result.err
    assert f":{port:04X}".lower() not in result.out.lower() and b"sleep".hex() not in result.out
