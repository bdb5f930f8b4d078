"""Daemon sessions prepared before their order, attacked: an agent reaching for the processes
prepared for later sessions, an agent that needs its limits to be in place from its first
instruction, and a prepared stage that dies just as its order is handed over."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import gone, ready, until, waiting

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

_REACH = (
    "import json, os, signal, sys\n"
    "out = {}\n"
    "for pid in map(int, sys.argv[1:]):\n"
    "    try:\n"
    "        os.kill(pid, 0)\n"
    "        out[pid] = 'signalled'\n"
    "    except ProcessLookupError:\n"
    "        out[pid] = 'no such process'\n"
    "    except PermissionError:\n"
    "        out[pid] = 'not permitted'\n"
    "    out[f'proc {pid}'] = os.path.exists(f'/proc/{pid}/status')\n"
    "out['fds'] = sorted(int(fd) for fd in os.listdir('/proc/self/fd'))\n"
    "out['cgroup'] = open('/proc/self/cgroup').read()\n"
    "print(json.dumps(out))\n"
)


def test_an_agent_cannot_name_or_signal_the_processes_prepared_for_later_sessions(daemon: RunningDaemon) -> None:
    prepared = ready(daemon)
    pids = [*prepared, *(p for inits in prepared.values() for p in inits)]
    result = daemon.adl_exec("python3", "-c", _REACH, *map(str, pids))
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    for pid in pids:
        # Its own PID namespace and /proc: a host pid names nothing it can reach (a pid that
        # happens to exist in the namespace is one of the session's own, never a prepared one).
        assert seen[str(pid)] in ("no such process", "signalled") and not seen[f"proc {pid}"], seen
        if seen[str(pid)] == "signalled":
            assert pid < 16, seen
    assert seen["fds"] == [0, 1, 2, 3], seen  # stdio, and the directory it lists
    # It runs in its own session's cgroup, not in the spawner's where it was prepared.
    session = next(r["corr"] for r in reversed(daemon.records()) if r["intent"].endswith(".launch"))
    memory = next(line for line in seen["cgroup"].splitlines() if line.split(":")[1] in ("memory", ""))
    assert memory.endswith(f"/{daemon.group}/{session}"), seen["cgroup"]
    # The one prepared for a later session is untouched, still waiting for its order (the other ran
    # this one).
    still = waiting(daemon)
    assert [pid for pid in prepared if pid in still and not gone(pid)], (prepared, still)


def test_a_prepared_agent_is_held_to_its_memory_limit_from_its_first_instruction(daemon: RunningDaemon) -> None:
    ready(daemon)
    # The test agent's limit is 64 MiB: touching 256 MiB must not succeed.
    grab = "b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived', flush=True)"
    result = daemon.adl_exec("python3", "-c", grab)
    assert "survived" not in result.stdout and result.returncode != 0, (result.returncode, result.stderr)


def test_a_prepared_stage_dead_when_its_order_comes_refuses_and_records_the_session(daemon: RunningDaemon) -> None:
    prepared = ready(daemon)
    for supervisor in prepared:  # neither can notice its stage's death before the order is handed over
        os.kill(supervisor, signal.SIGSTOP)
    try:
        for inits in prepared.values():
            for init in inits:
                os.kill(init, signal.SIGKILL)  # init, and with its PID namespace the future agent
        assert until(lambda: all(gone(i) for inits in prepared.values() for i in inits), 5)
        session_file = daemon.box.ws / "dead-stage.json"
        client = subprocess.Popen(
            daemon.exec_argv("python3", "-c", "print('ran')", options=("--session-file", str(session_file))),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

        def listed() -> list[pb.SessionInfo]:
            return list(daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions)

        assert until(lambda: listed() and listed()[0].pid > 0, 20)  # the spawner has reported its supervisor
        (info,) = daemon.admin_stub().ListSessions(pb.ListSessionsRequest()).sessions
        assert info.pid in prepared, (info.pid, prepared)
    finally:
        for supervisor in prepared:
            os.kill(supervisor, signal.SIGCONT)
    out, err = client.communicate(timeout=30)
    assert client.returncode == 125 and "ran" not in out, (client.returncode, out, err)
    refused = [r for r in daemon.records() if r["corr"] == info.session and r["intent"].endswith(".refused")]
    assert refused and "stage" in json.dumps(refused[0]["payload"]), refused
    assert until(lambda: not daemon.sessions_left(), 10), daemon.sessions_left()
    assert until(lambda: all(gone(p) for p in prepared), 10)
    # Both were replaced; the next launch runs.
    ready(daemon)
    again = daemon.adl_exec("python3", "-c", "print('ran')")
    assert again.returncode == 0 and again.stdout == "ran\n", again.stderr
