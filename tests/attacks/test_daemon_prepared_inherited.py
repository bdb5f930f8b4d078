"""Daemon sessions prepared before their order, attacked for what the prepared processes carry
from the spawner that a supervisor forked at its order did not pass on: its signal mask, its
stdio held by the session's init, the policy compiled before a reload, and its processes left
when the daemon or the spawner is killed or stopped."""

from __future__ import annotations

import json
import os
import signal

import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import children, gone, ready, spawner_of, until, waiting

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def blocked(pid: int | str) -> int:
    """The signal mask of a process, as /proc shows it (bit n - 1 is signal n)."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1], 16) for line in f if line.startswith("SigBlk:"))


_MASK = (
    "import json\n"
    "with open('/proc/self/status') as f:\n"
    "    print(json.dumps([line for line in f if line.startswith('SigBlk:')]))\n"
)


def test_a_prepared_agent_starts_with_no_signal_blocked(daemon: RunningDaemon) -> None:
    # The spawner keeps SIGUSR1 (its TerminateSession word) blocked in a prepared supervisor until
    # its order's handler is set; a mask survives exec, so the agent must not inherit it: a
    # supervisor forked at its order unblocks it before it forks the stage.
    prepared = ready(daemon)
    usr1 = 1 << (signal.SIGUSR1 - 1)
    for inits in prepared.values():
        for init in inits:
            assert not blocked(init) & usr1, (init, hex(blocked(init)))
            for future_agent in children(init):
                assert not blocked(future_agent) & usr1, (future_agent, hex(blocked(future_agent)))
    result = daemon.adl_exec("python3", "-c", _MASK)
    assert result.returncode == 0, result.stderr
    (line,) = json.loads(result.stdout)
    assert int(line.split()[1], 16) == 0, line


_REACH_INIT = (
    "import json, os\n"
    "out = {}\n"
    "for name, call in [\n"
    "    ('list fds', lambda: os.listdir('/proc/1/fd')),\n"
    "    ('read link', lambda: os.readlink('/proc/1/fd/2')),\n"
    "    ('write stderr', lambda: os.close(os.open('/proc/1/fd/2', os.O_WRONLY | os.O_APPEND))),\n"
    "    ('write stdout', lambda: os.close(os.open('/proc/1/fd/1', os.O_WRONLY | os.O_APPEND))),\n"
    "    ('read mem', lambda: open('/proc/1/mem', 'rb').close()),\n"
    "    ('read environ', lambda: open('/proc/1/environ', 'rb').read()),\n"
    "]:\n"
    "    try:\n"
    "        call()\n"
    "        out[name] = 'reached'\n"
    "    except OSError as exc:\n"
    "        out[name] = exc.strerror\n"
    "print(json.dumps(out))\n"
)


def test_an_agent_cannot_reach_the_daemon_stdio_its_prepared_init_holds(daemon: RunningDaemon) -> None:
    # A prepared init was forked before its order, so it holds the spawner's stdio (the daemon's
    # log), not its caller's: the agent, pid 2 under it, must not name, write or read any of it.
    ready(daemon)
    result = daemon.adl_exec("python3", "-c", _REACH_INIT)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen and "reached" not in seen.values(), seen
    assert daemon.log.read_text().count("reached") == 0


_GRAB = "b = bytearray(48 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint('survived', flush=True)"


def test_a_policy_made_stricter_after_preparation_holds_the_next_agent(daemon: RunningDaemon) -> None:
    # Prepared under a 64 MiB limit; the operator lowers it to 24 MiB and reloads before the order.
    ready(daemon)
    before = daemon.adl_exec("python3", "-c", _GRAB)
    assert before.returncode == 0 and "survived" in before.stdout, before.stderr
    assert until(lambda: len(waiting(daemon)) == 2 and all(len(c) == 1 for c in waiting(daemon).values()), 15)
    limits = {**daemon.box.permissions["resource_limits"], "max_memory_mb": 24, "max_concurrent": 1}
    daemon.write_adl("sandboxed", "Sandboxed", {**daemon.box.permissions, "resource_limits": limits})
    reply = daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())
    assert not reply.problems and reply.changed, reply
    after = daemon.adl_exec("python3", "-c", _GRAB)
    assert "survived" not in after.stdout and after.returncode != 0, (after.returncode, after.stderr)


def _prepared_pids(daemon: RunningDaemon) -> list[int]:
    """Two prepared supervisors, each with its init and future agent (forked by init just after)."""

    def pids() -> list[int]:
        prepared = waiting(daemon)
        inits = [init for each in prepared.values() for init in each]
        return [*prepared, *inits, *(agent for init in inits for agent in children(init))]

    ready(daemon)
    assert until(lambda: len(pids()) == 6, 10), pids()
    return pids()


def test_a_killed_daemon_leaves_no_prepared_process(daemon: RunningDaemon) -> None:
    pids = _prepared_pids(daemon)
    daemon.kill()
    assert until(lambda: all(gone(pid) for pid in pids), 10), [pid for pid in pids if not gone(pid)]


def test_a_killed_spawner_leaves_no_prepared_process(daemon: RunningDaemon) -> None:
    pids = _prepared_pids(daemon)
    os.kill(spawner_of(daemon), signal.SIGKILL)
    assert until(lambda: all(gone(pid) for pid in pids), 10), [pid for pid in pids if not gone(pid)]


def test_a_stopped_daemon_leaves_no_prepared_process(daemon: RunningDaemon) -> None:
    pids = _prepared_pids(daemon)
    assert daemon.stop() == 0, daemon.log.read_text()[-2000:]
    assert until(lambda: all(gone(pid) for pid in pids), 10), [pid for pid in pids if not gone(pid)]
