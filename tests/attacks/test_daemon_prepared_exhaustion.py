"""Daemon sessions prepared before their order, attacked by exhaustion: a spawner out of
descriptors while it refills its prepared supervisors must serve on, as it does when a supervisor
forked at its order finds none left (every running session depends on the spawner)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

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
