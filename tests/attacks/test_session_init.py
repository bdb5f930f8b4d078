"""The session's PID-namespace init as a small interpreter of its own (enforcer/sandbox/pidns.py,
pidns_init.py): it is exec'd after forking the future agent, so whatever reaches it while it
starts (a signal, the launcher's death, a failed join of the session's cgroup) must still be
handled as by the init it replaces, and the agent must inherit nothing of that hand-over."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcer.sandbox import cgroups, pidns, pidns_init

from ..helpers.processes import alive
from ..helpers.sandbox import Sandbox, needs_root, session_cgroups

pytestmark = needs_root
PR_SET_CHILD_SUBREAPER = 36
REPORT_JOIN = """
try:
    joined()
    os.write(report, b"joined")
except OSError as exc:
    os.write(report, str(exc).encode())
"""


def _read_int(fd: int, timeout: float = 10.0) -> int:
    """A number written as a line on `fd` (read byte by byte: what follows is for the test)."""
    data = b""
    while not data.endswith(b"\n"):
        readable, _, _ = select.select([fd], [], [], timeout)
        assert readable, "nothing reported in time"
        byte = os.read(fd, 1)
        assert byte, "the reporting process is gone"
        data += byte
    return int(data)


@contextlib.contextmanager
def _stage(join_files: list[str], pid2_code: str) -> Iterator[tuple[int, int, int, int]]:
    """Fork a stage (this process a subreaper, as a launcher) that forks a small init; pid 2 writes
    its host pid on a pipe, then runs `pid2_code` (exec'd with `joined` in scope). Yields (stage,
    status read end, report read end, init). Everything it started is killed afterwards."""
    report_read, report_write = os.pipe()
    status_read, status_write = os.pipe()
    stage = os.fork()
    if stage == 0:
        code = 1
        try:
            os.close(report_read)
            os.close(status_read)
            joined = pidns.fork_init(status_write, join_files)
            os.write(report_write, f"{pidns.host_pid()}\n".encode())
            exec(pid2_code, {"joined": joined, "os": os, "time": time, "report": report_write})
            code = 0
        finally:
            os._exit(code)
    os.close(report_write)
    os.close(status_write)
    init = pidns.read_pid(status_read)
    assert init is not None
    pid2 = None
    try:
        pid2 = _read_int(report_read)
        yield stage, status_read, report_read, init
    finally:
        for pid in (pid2, init):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for pid in (stage, init):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        os.close(status_read)
        os.close(report_read)


@pytest.fixture
def subreaper() -> None:
    import ctypes

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # init is adopted here, as by a launcher


def test_a_signal_sent_while_init_starts_reaches_the_agent(subreaper: None, tmp_path: Path) -> None:
    """SIGTERM to init as soon as pid 2 exists, while init waits for the stage or execs its small
    interpreter (a pid 1 without a handler drops it): it is passed on once init runs."""
    join = tmp_path / "cgroup.procs"
    with _stage([str(join)], "joined()\ntime.sleep(30)\n") as (stage_pid, status_read, _report, init):
        os.kill(init, signal.SIGTERM)
        os.waitpid(stage_pid, 0)  # then init is this process's child (a subreaper's)
        os.waitpid(init, 0)
        status = pidns.read_status(status_read)
    assert status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def test_the_small_init_dies_with_its_launcher(tmp_path: Path) -> None:
    """Its parent-death signal is set before the exec and must survive it: the launcher killed, init
    goes, and with it every process of the namespace (no guardian here to clean up)."""
    join = tmp_path / "cgroup.procs"
    report_read, report_write = os.pipe()
    launcher = os.fork()
    if launcher == 0:
        code = 1
        try:
            os.close(report_read)
            import ctypes

            ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
            status_read, status_write = os.pipe()
            if os.fork() == 0:  # the stage
                try:
                    joined = pidns.fork_init(status_write, [str(join)])
                    joined()
                    os.write(report_write, f"{pidns.host_pid()}\n".encode())
                    time.sleep(60)
                finally:
                    os._exit(0)
            init = pidns.read_pid(status_read)
            os.write(report_write, f"{init}\n".encode())
            time.sleep(60)
            code = 0
        finally:
            os._exit(code)
    os.close(report_write)
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 15
        data = b""
        while data.count(b"\n") < 2 and time.monotonic() < deadline:
            if select.select([report_read], [], [], 1.0)[0]:
                chunk = os.read(report_read, 64)
                assert chunk, "the launcher or pid 2 ended early"
                data += chunk
        pids = [int(x) for x in data.split()]
        assert len(pids) == 2, data
        init = next(p for p in pids if Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[1:2] == [b"-S"])
        os.kill(launcher, signal.SIGKILL)
        os.waitpid(launcher, 0)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(p) for p in pids), f"init {init} or pid 2 outlived the launcher"
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(launcher, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(launcher, 0)
        os.close(report_read)


def test_an_agent_cannot_start_unless_init_joined_the_sessions_cgroup(subreaper: None, tmp_path: Path) -> None:
    """A join that fails (here: no such cgroup) is pid 2's error before anything of the agent runs."""
    missing = tmp_path / "gone" / "cgroup.procs"
    code = REPORT_JOIN
    with _stage([str(missing)], code) as (_stage_pid, _status, report_read, _init):
        readable, _, _ = select.select([report_read], [], [], 10.0)
        answer = os.read(report_read, 4096) if readable else b""
    assert answer and answer != b"joined" and b"No such file" in answer, answer


def test_the_small_init_loads_nothing_of_the_project_nor_enum(tmp_path: Path) -> None:
    """It runs as `python -S -I -c INIT_CODE` from the launcher's directory: nothing imported from
    there, from site or the project, and not `signal` (its enums)."""
    (tmp_path / "os.py").write_text("raise SystemExit('imported from the working directory')\n")
    ours, theirs = socket.socketpair()
    status_read, status_write = os.pipe()
    try:
        run = subprocess.run(
            [
                sys.executable,
                "-S",
                "-I",
                "-X",
                "importtime",
                "-c",
                pidns.INIT_CODE,
                "999999",
                str(status_write),
                str(theirs.fileno()),
                str(tmp_path / "cgroup.procs"),
            ],
            pass_fds=[theirs.fileno(), status_write],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
        )
        assert ours.recv(16) == pidns_init.JOINED
    finally:
        for fd in (status_read, status_write):
            os.close(fd)
        ours.close()
        theirs.close()
    assert run.returncode == 1  # no child to wait for: init gives up
    imported = {line.rsplit("|", 1)[1].strip() for line in run.stderr.splitlines() if line.count("|") == 2}
    assert imported and not any(n.startswith(("enforcer", "site", "signal", "enum", "typing")) for n in imported)
    assert pidns._STATUS.size == pidns_init.STATUS_SIZE


def test_the_agent_inherits_no_blocked_or_ignored_signal(sandbox: Sandbox) -> None:
    """The forwarded signals are blocked across init's exec: pid 2 must unblock them before the
    agent starts (cat: an interpreter would ignore some itself)."""
    r = sandbox.run("cat", "/proc/self/status")
    masks = {line.split()[0]: line.split()[1] for line in r.out.splitlines() if line.startswith(("SigBlk", "SigIgn"))}
    assert r.code == 0 and masks == {"SigBlk:": "0" * 16, "SigIgn:": "0" * 16}, (r.out, r.err)


def test_an_adl_exec_sessions_init_is_the_small_one_in_the_sessions_cgroup(sandbox: Sandbox) -> None:
    code = "print('ready', flush=True)\nimport time; time.sleep(1.5)\n"
    environ = sandbox.environ()
    proc = subprocess.Popen(
        sandbox.exec_argv("python3", "-c", code),
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        inits = [
            pid
            for pid in _children(proc.pid)
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[4:5] == [pidns.INIT_CODE.encode()]
        ]
        assert len(inits) == 1
        groups = Path(f"/proc/{inits[0]}/cgroup").read_text()
        assert any(name in groups for name in session_cgroups(sandbox.group)), groups
        proc.wait(timeout=30)
        assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_sigterm_and_sighup_to_adl_exec_reach_the_agent(sandbox: Sandbox) -> None:
    """Through the small init: the agent handles them and chooses its exit code."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        code = (
            "import os, signal, sys, time\n"
            f"signal.signal({int(sig)}, lambda *_: os._exit(7))\n"
            "print('ready', flush=True)\n"
            "time.sleep(20)\n"
        )
        proc = subprocess.Popen(
            sandbox.exec_argv("python3", "-c", code),
            env=sandbox.environ(),
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
            proc.send_signal(sig)
            assert proc.wait(timeout=20) == 7, sig
        finally:
            proc.kill()
            proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(entry))
    return out


def test_the_agent_cannot_signal_or_read_its_init(sandbox: Sandbox) -> None:
    """Init is pid 1 of the agent's namespace and stays root: no signal reaches it from the agent,
    its /proc entry is hidden, and the session still ends with the agent's own status."""
    code = (
        "import errno, os, resource, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP, signal.SIGINT):\n"
        "    try:\n"
        "        os.kill(1, sig)\n"
        "        print('ESCAPED kill', sig)\n"
        "    except OSError as exc:\n"
        "        print('BLOCKED kill', errno.errorcode[exc.errno])\n"
        "for path in ('/proc/1/cmdline', '/proc/1/environ', '/proc/1/status'):\n"
        "    try:\n"
        "        open(path, 'rb').read()\n"
        "        print('ESCAPED read', path)\n"
        "    except OSError as exc:\n"
        "        print('BLOCKED read', errno.errorcode[exc.errno])\n"
        "try:\n"
        "    resource.prlimit(1, resource.RLIMIT_NOFILE, (1, 1))\n"
        "    print('ESCAPED prlimit')\n"
        "except OSError as exc:\n"
        "    print('BLOCKED prlimit', errno.errorcode[exc.errno])\n"
        "raise SystemExit(5)\n"
    )
    r = sandbox.python(code)
    assert r.code == 5 and "ESCAPED" not in r.out, (r.out, r.err)
    assert r.out.count("BLOCKED") == 8, r.out
    assert r.record("exit")["payload"]["reason"] == "exit"


@pytest.mark.parametrize("delay_s", [0.0, 0.02, 0.05, 0.1])
@pytest.mark.parametrize("after", ["cgroup", "stage"])
def test_adl_exec_killed_while_init_starts_leaves_no_process(sandbox: Sandbox, after: str, delay_s: float) -> None:
    """Init and pid 2 join the session's cgroup only after their forks (init once its interpreter
    runs), so the guardian's kill may miss them: killed in that window, adl-exec must still leave no
    process of the session (pid 2 ends at the end of its order socket, init when pid 2 ends), and no
    cgroup once the guardian was told it (from the stage's fork on: adl-exec killed between making
    the cgroup and telling the guardian leaves the empty cgroup, with or without a small init)."""
    proc = subprocess.Popen(
        sandbox.exec_argv("python3", "-c", "pass"),
        env=sandbox.environ(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    marks = (sandbox.group.encode(), str(sandbox.root).encode())
    try:
        deadline = time.monotonic() + 20
        while not session_cgroups(sandbox.group) or (after == "stage" and len(_children(proc.pid)) < 2):
            assert proc.poll() is None and time.monotonic() < deadline, f"no session cgroup or {after} appeared"
            time.sleep(0.001)
        time.sleep(delay_s)
        proc.kill()
        proc.wait(timeout=10)
        # Until nothing is left for a while: a process is not found while it execs (its command
        # line reads empty then), and a small init ends only after pid 2 did.
        deadline, quiet_since = time.monotonic() + 10, None
        while time.monotonic() < deadline:
            busy = _holding(marks) or (after == "stage" and session_cgroups(sandbox.group))
            quiet_since = None if busy else quiet_since or time.monotonic()
            if quiet_since is not None and time.monotonic() - quiet_since > 0.5:
                break
            time.sleep(0.02)
        assert _holding(marks) == []
        if after == "stage":
            assert session_cgroups(sandbox.group) == []
    finally:
        proc.kill()
        proc.wait()
        for pid in _holding(marks):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if after == "cgroup":
            for session in cgroups.existing(group=sandbox.group).values():
                session.remove(timeout=5)


def _holding(marks: tuple[bytes, ...]) -> list[int]:
    """Live processes whose command line names this sandbox (its cgroup group or its directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if any(mark in cmdline for mark in marks) and alive(int(entry)):
                found.append(int(entry))
    return found
