"""A daemon launch attacked from outside: its supervisor killed at every step, a hostile working
directory, an agent that hides its children. Nothing of the agent's may outlive its session, run
outside its cgroup or leave a cgroup behind."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import time
from pathlib import Path

import pytest

from enforcer.audit.verify import verify_directory
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import until

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def _with_marker(marker: str) -> list[int]:
    """Every live process whose command line holds `marker` (zombies have none)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


# An agent that double-forks a detached child, which keeps running after the agent's own exit.
_DOUBLE_FORK = (
    "import os, sys, time\n"
    "if os.fork() == 0:\n"
    "    os.setsid()\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(60)\n"
    "    os._exit(0)\n"
    "print('up', flush=True)\n"
    "time.sleep(60)\n"
)


def _supervisor_of(daemon: RunningDaemon, client: subprocess.Popen[str]) -> int:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and client.poll() is None:
        sessions = daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions
        if sessions and sessions[0].pid > 0:
            return sessions[0].pid
        time.sleep(0.001)
    raise AssertionError(("no supervisor", client.poll(), client.stderr.read() if client.poll() is not None else ""))


def _parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def _kill_at_each_step(daemon: RunningDaemon, victim: str) -> None:
    """Launch a double-forking agent and SIGKILL `victim` (the session's supervisor, the spawner or
    the daemon) after delays that land before the stage joined the session's cgroup, during the
    set-up, around the launch record's sync, and while the agent and its detached child run."""
    for delay in (0.0, 0.005, 0.02, 0.05, 0.1, 0.2, None):
        marker = "marker-" + secrets.token_hex(6)
        client = subprocess.Popen(
            daemon.exec_argv("python3", "-c", _DOUBLE_FORK, marker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            supervisor = _supervisor_of(daemon, client)
            spawner = _parent_of(supervisor)
            target = {"supervisor": supervisor, "spawner": spawner}.get(victim)
            if delay is None:
                assert client.stdout is not None and client.stdout.readline() == "up\n"
            else:
                time.sleep(delay)
            if target is None:
                daemon.kill()
            else:
                os.kill(target, signal.SIGKILL)
            assert until(lambda m=marker: not _with_marker(m), 5, every_s=0.01), (
                victim,
                delay,
                "the session outlived it",
            )
            assert until(lambda: not daemon.sessions_left(), 5, every_s=0.01), (victim, delay, daemon.sessions_left())
            client.wait(timeout=20)
            if victim != "supervisor":  # launches are refused until the daemon restarts
                daemon.stop()
                daemon.start()
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()
            for pid in _with_marker(marker):
                os.kill(pid, signal.SIGKILL)
    assert daemon.adl_exec("python3", "-c", "pass").returncode == 0


def test_a_supervisor_killed_at_any_step_of_the_launch_leaves_nothing_running(daemon: RunningDaemon) -> None:
    """The spawner, the supervisor's parent, kills what is left and removes the session's cgroup."""
    _kill_at_each_step(daemon, "supervisor")


def test_the_spawner_killed_at_any_step_of_a_launch_leaves_nothing_running(daemon: RunningDaemon) -> None:
    """The supervisors die with the spawner; the spawner's guardian kills and removes every session."""
    _kill_at_each_step(daemon, "spawner")


def test_the_daemon_killed_at_any_step_of_a_launch_leaves_nothing_running(daemon: RunningDaemon) -> None:
    """The spawner dies with the daemon, and with it every session (as above)."""
    _kill_at_each_step(daemon, "daemon")


def test_a_working_directory_in_the_host_s_proc_shows_no_host_process(daemon: RunningDaemon) -> None:
    """/proc is a plain directory anyone may enter: a caller that launches from it must not hand
    its agent a view of the host's processes (the agent's own /proc is its PID namespace's, mounted
    after it entered its directory): the launch is refused."""
    probe = (
        "import os\n"
        "try:\n"
        "    names = [n for n in os.listdir('.') if n.isdigit()]\n"
        "except OSError as exc:\n"
        "    names = [type(exc).__name__]\n"
        "try:\n"
        "    one = open('1/cmdline', 'rb').read()\n"
        "except OSError as exc:\n"
        "    one = type(exc).__name__.encode()\n"
        "print(os.getcwd(), len(names), one[:40])\n"
    )
    done = subprocess.run(
        daemon.exec_argv("python3", "-c", probe), capture_output=True, text=True, timeout=60, cwd="/proc"
    )
    host_init = Path("/proc/1/cmdline").read_bytes()[:40]
    assert repr(host_init) not in done.stdout, (done.stdout, done.stderr)
    assert done.returncode == 125 and "a directory of /proc is never a session's" in done.stderr, (
        done.stdout,
        done.stderr,
    )


def _session_records(daemon: RunningDaemon, session: str) -> list[str]:
    return [r["intent"].rsplit(".", 1)[-1] for r in daemon.records() if r["corr"] == session]


def test_an_end_the_caller_hears_of_is_in_the_log_even_if_the_supervisor_dies_at_once(
    daemon: RunningDaemon,
) -> None:
    """SessionEnded goes out before the audit writer's close: concurrent sessions, each of whose
    callers finds its launch, exit and evidence records in the log the moment it hears the end,
    then its supervisor SIGKILLed right then (during the close). The chain stays whole and ordered."""
    daemon.stop()
    daemon.write_agents(max_concurrent=4)
    daemon.start()
    agent = "import sys; sys.stdin.readline(); open(sys.argv[1]).read()"  # a denied read, then exit
    for _round in range(3):
        clients = []
        for n in range(3):
            session_file = daemon.box.ws / f"session-{_round}-{n}.json"
            argv = daemon.exec_argv(
                "python3", "-c", agent, str(daemon.box.outside / "private.txt"),
                options=("--session-file", str(session_file)),
            )  # fmt: skip
            clients.append(
                (subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True), session_file)
            )
        deadline = time.monotonic() + 20
        supervisors: dict[str, int] = {}
        while len(supervisors) < 3:  # a session not started yet is listed with pid 0
            assert time.monotonic() < deadline, [c.poll() for c, _ in clients]
            listed = daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions
            supervisors = {s.session: s.pid for s in listed if s.pid > 0}
            time.sleep(0.01)
        for client, _ in clients:
            assert client.stdin is not None
            client.stdin.write("\n")
            client.stdin.flush()
        for client, session_file in clients:
            client.wait(timeout=30)
            session = json.loads(session_file.read_text())["session"]
            assert supervisors[session] > 0
            with contextlib.suppress(ProcessLookupError):
                os.kill(supervisors[session], signal.SIGKILL)
            kinds = _session_records(daemon, session)
            assert client.returncode == 1, client.stderr.read()  # type: ignore[union-attr]
            assert kinds[0] == "launch" and kinds[-2:] == ["exit", "evidence"], kinds
    assert until(lambda: not daemon.sessions_left(), 5, every_s=0.01), daemon.sessions_left()
    daemon.stop()
    report = verify_directory(daemon.audit)
    assert report.intact, report
    seqs = [r["seq"] for r in daemon.records()]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
