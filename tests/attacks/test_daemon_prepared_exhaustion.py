"""Daemon sessions prepared before their order, attacked by exhaustion: a spawner out of
descriptors while it refills its prepared supervisors must serve on, as it does when a supervisor
forked at its order finds none left (every running session depends on the spawner); a caller must
not make the spawner fork prepared supervisors in a loop."""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path

import pytest

from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import children, cmdline, spawner_of
from ..unit.test_spawner_orders import SPAWNER_PRELUDE, members_of, order, run_spawner_script

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the spawner makes cgroups")

_PREPARING = "cgroup_group=group, helper_memory_mb=64,"
assert _PREPARING in SPAWNER_PRELUDE

OUT_OF_DESCRIPTORS_SCRIPT = (
    SPAWNER_PRELUDE.replace(_PREPARING, _PREPARING + " prepared_sessions=2,")
    + """
import time
real_socketpair = socket.socketpair
def socketpair(*args, **kwargs):
    # What a spawner with every descriptor taken (one pidfd per running session) meets first when
    # it prepares a supervisor: the socket the order would go over.
    if sys._getframe(1).f_code.co_name == "_prepare_one":
        raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
    return real_socketpair(*args, **kwargs)
socket.socketpair = socketpair
handle = start()
time.sleep(1)  # the spawner tries to prepare its supervisors meanwhile
report = send_order(handle, members)
stop(handle)
print(json.dumps(report))
"""
)


def test_a_spawner_out_of_descriptors_while_it_prepares_serves_on(tmp_path: Path) -> None:
    from enforcer.daemon import spawner

    group = f"adl-test-prepfds-{uuid.uuid4().hex[:8]}"
    members = members_of(order(session="s-prep-fds").to_json())
    result, left = run_spawner_script(OUT_OF_DESCRIPTORS_SCRIPT, tmp_path, members, group)
    assert result.returncode == 0, result.stderr
    reported = json.loads(result.stdout)
    assert reported == {"caller_heard": True, "daemon": ["SessionStarted", "SessionGone"]}, result.stderr[-2000:]
    assert "no supervisor could be prepared" in result.stderr, result.stderr[-2000:]
    assert left == {group: [], group + spawner.HELPERS_SUFFIX: []}


@pytest.mark.daemon
def test_a_caller_cycling_through_agents_does_not_make_the_spawner_prepare_in_a_loop(daemon: RunningDaemon) -> None:
    # Supervisors prepared before the spawner compiles an order's documents are retired, as they
    # would compile them again. A caller allowed many agents (more than the compiled policies a
    # process remembers, to keep it up for good) makes every order compile: each must not cost
    # two preparations besides its own supervisor.
    agents = 34
    for i in range(agents):
        daemon.write_adl(f"cycled-{i}", f"Cycled{i}", daemon.box.permissions)
    reply = daemon.admin_stub().ReloadPolicies(pb.ReloadRequest())
    assert not reply.problems, reply
    spawner = spawner_of(daemon)
    forked: set[int] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            forked.update(p for p in children(spawner) if cmdline(p).split(b"\0")[1:3] != [b"-S", b"-I"])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(agents):
            result = daemon.adl_exec("python3", "-c", "pass", agent=f"Cycled{i}")
            assert result.returncode == 0, result.stderr
            time.sleep(0.1)  # orders have paused: the spawner refills
    finally:
        done.set()
        watcher.join()
    # One supervisor per order, and a few prepared ones; not two more per order.
    assert len(forked) <= agents + 16, (len(forked), agents)
