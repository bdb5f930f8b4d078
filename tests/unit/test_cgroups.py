"""cgroup v2 and v1 behind one interface, exercised on fake trees (these machines run v1 for real,
which tests/integration covers)."""

from __future__ import annotations

from pathlib import Path

from enforcer.sandbox import cgroups
from enforcer.sandbox.cgroups import Limits


def fake_v2(root: Path) -> Path:
    (root / "agents").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    for level in (root, root / "agents"):
        (level / "cgroup.procs").write_text("")
        (level / "cgroup.subtree_control").write_text("")
    return root


def test_v2_detected_created_below_own_cgroup_and_limited(tmp_path: Path) -> None:
    root = fake_v2(tmp_path)
    assert cgroups.detect(root) == "v2"
    group = cgroups.create("s1", root, proc_cgroup="0::/agents\n")
    assert isinstance(group, cgroups.CgroupV2) and group.path == root / "agents" / cgroups.GROUP / "s1"
    assert (root / "agents" / "cgroup.subtree_control").read_text() == "+pids"  # each controller written in turn
    group.apply(Limits(memory_bytes=64 << 20, cpu_percent=50, pids_max=40))
    assert (group.path / "memory.max").read_text() == str(64 << 20)
    assert (group.path / "memory.swap.max").read_text() == "0"
    assert (group.path / "cpu.max").read_text() == "50000 100000"
    assert (group.path / "pids.max").read_text() == "40"
    (group.path / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    (group.path / "pids.events").write_text("max 2\n")
    assert group.counters() == cgroups.Counters(oom_kills=1, pids_max_hits=2)
    group.kill_all()
    assert (group.path / "cgroup.kill").read_text() == "1"
    assert group.join_files() == [str(group.path / "cgroup.procs")]


def test_v1_detected_with_unified_kill(tmp_path: Path) -> None:
    for controller in ("memory", "cpu", "pids", "unified"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "cgroup.procs").write_text("")
    assert cgroups.detect(tmp_path) == "v1"
    group = cgroups.create("s2", tmp_path, proc_cgroup="4:memory:/job\n1:cpu:/\n8:pids:/\n0::/\n")
    assert isinstance(group, cgroups.CgroupV1)
    assert group.memory == tmp_path / "memory" / "job" / cgroups.GROUP / "s2"
    group.apply(Limits(memory_bytes=1 << 20, cpu_percent=20, pids_max=10))
    assert (group.cpu / "cpu.cfs_quota_us").read_text() == "20000"
    assert (group.memory / "memory.limit_in_bytes").read_text() == str(1 << 20)
    (group.memory / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert group.counters().oom_kills == 2
    assert group.unified is not None
    (group.unified / "cgroup.kill").write_text("")  # the kernel provides it on a real cgroup2 mount
    group.kill_all()
    assert (group.unified / "cgroup.kill").read_text() == "1"
    assert len(group.join_files()) == 4


def test_nothing_usable(tmp_path: Path) -> None:
    assert cgroups.detect(tmp_path) == "none"
