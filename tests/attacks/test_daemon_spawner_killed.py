"""A spawner killed outright (SIGKILL: the OOM killer, an operator's mistake) cannot clean up: its
prepared supervisors die with it and leave their cgroup (prepared-<spawner pid>) and the helpers'
directories empty. The daemon serves on, refusing launches until it restarts; before, its stop then
left those directories behind, and a daemon that was not started again kept them for good."""

from __future__ import annotations

import os
import signal

import pytest

from enforcer.daemon.spawner import HELPERS_SUFFIX
from enforcer.sandbox import cgroups

from ..helpers.daemon import RunningDaemon
from ..helpers.prepared import ready, spawner_of, until

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]


def test_a_daemon_whose_spawner_was_killed_leaves_no_helpers_directory(daemon: RunningDaemon) -> None:
    ready(daemon)
    spawner = spawner_of(daemon)
    helpers = daemon.group + HELPERS_SUFFIX
    os.kill(spawner, signal.SIGKILL)
    # Its prepared supervisors and their stages die with it: their cgroup is left, empty.
    assert until(lambda: not cgroups.existing(group=helpers)[f"prepared-{spawner}"].members(), 10)
    result = daemon.adl_exec("true")
    assert result.returncode != 0, "launches are refused once the spawner is gone"
    assert daemon.stop() == 0
    assert "the spawner stopped" in daemon.log.read_text()
    assert not cgroups.existing(group=helpers), "the killed spawner's prepared group was left"
    assert not [d for d in cgroups.group_directories(group=helpers) if d.exists()]
