"""cgroup v2 and v1 behind one interface, exercised on fake trees (these machines run v1 for real,
which tests/integration covers)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

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


def fake_v2_delegated(root: Path, unit: str = "system.slice/adl-enforcerd.service", controllers: str = "") -> Path:
    """A pure v2 tree with a delegated service cgroup (systemd marks it with trusted.delegate)."""
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    directory = root / unit
    directory.mkdir(parents=True)
    (directory / "cgroup.controllers").write_text(controllers or "cpu io memory pids\n")
    for name in ("cgroup.procs", "cgroup.subtree_control"):
        (directory / name).write_text("")
    os.setxattr(directory, "trusted.delegate", b"1")
    return directory


def test_v2_delegated_daemon_goes_into_a_leaf_and_sessions_beside_it(tmp_path: Path) -> None:
    unit = fake_v2_delegated(tmp_path)
    placed = cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service\n", group="g")
    assert placed == cgroups.Placement(unit / cgroups.LEAF, unit, ("memory", "cpu", "pids"))
    assert placed.leaf.is_dir()
    assert (unit / "cgroup.subtree_control").read_text() == "+pids"  # each controller written in turn
    # What the daemon, the spawner and its supervisors see from the leaf: sessions beside it.
    in_leaf = "0::/system.slice/adl-enforcerd.service/daemon\n"
    group = cgroups.create("s1", tmp_path, proc_cgroup=in_leaf, group="g")
    assert isinstance(group, cgroups.CgroupV2) and group.path == unit / "g" / "s1"
    helpers = cgroups.create("s1", tmp_path, proc_cgroup=in_leaf, group="g.helpers")
    assert helpers.directories == [unit / "g.helpers" / "s1"]
    assert cgroups.group_directories(tmp_path, "g", in_leaf) == [unit / "g"]
    assert list(cgroups.existing(tmp_path, "g", in_leaf)) == ["s1"]


def test_v2_started_in_the_leaf_already_keeps_it(tmp_path: Path) -> None:
    # systemd 254's DelegateSubgroup=daemon starts the daemon in <unit>/daemon.
    unit = fake_v2_delegated(tmp_path)
    (unit / cgroups.LEAF).mkdir()
    placed = cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service/daemon\n")
    assert placed is not None and placed.base == unit and placed.leaf == unit / cgroups.LEAF
    assert not (unit / cgroups.LEAF / cgroups.LEAF).exists()


def test_v2_only_the_controllers_the_cgroup_has_are_enabled(tmp_path: Path) -> None:
    fake_v2_delegated(tmp_path, controllers="memory pids\n")
    placed = cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service\n")
    assert placed is not None and placed.controllers == ("memory", "pids")


@pytest.mark.parametrize(
    ("proc_cgroup", "why"),
    [
        ("0::/user.slice/session-1.scope\n", "not delegated"),
        ("0::/\n", "the root cgroup"),
        ("1:memory:/x\n0::/system.slice/adl-enforcerd.service\n", "a hybrid: v1 controllers"),
    ],
)
def test_v2_nothing_moved_where_not_ours_to_arrange(tmp_path: Path, proc_cgroup: str, why: str) -> None:
    fake_v2_delegated(tmp_path)
    scope = tmp_path / "user.slice" / "session-1.scope"
    scope.mkdir(parents=True)
    assert cgroups.place_in_leaf(tmp_path, proc_cgroup) is None, why
    assert not any(p.name == cgroups.LEAF for p in tmp_path.rglob("*")), why


def test_v1_host_is_left_alone(tmp_path: Path) -> None:
    for controller in ("memory", "cpu", "pids"):
        (tmp_path / controller).mkdir()
        (tmp_path / controller / "cgroup.procs").write_text("")
    assert cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service\n") is None


def test_v2_group_named_like_the_leaf_is_refused(tmp_path: Path) -> None:
    fake_v2_delegated(tmp_path)
    with pytest.raises(cgroups.CgroupError, match="may not be named"):
        cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service\n", group=cgroups.LEAF)


def test_v2_processes_that_do_not_leave_are_an_error(tmp_path: Path) -> None:
    # A fake cgroup.procs never empties, as a cgroup whose processes cannot be moved would not.
    unit = fake_v2_delegated(tmp_path)
    (unit / "cgroup.procs").write_text(f"{os.getpid()}\n")
    with pytest.raises(cgroups.CgroupError, match="processes still in"):
        cgroups.place_in_leaf(tmp_path, "0::/system.slice/adl-enforcerd.service\n")
    assert (unit / "cgroup.subtree_control").read_text() == ""  # no controller enabled over them


UNIFIED = Path("/sys/fs/cgroup/unified")


@pytest.fixture
def own_unified_cgroup() -> Iterator[Path]:
    """A cgroup of this test's own on the real cgroup2 hierarchy (the hybrid's, without controllers)."""
    if os.geteuid() != 0 or not (UNIFIED / "cgroup.procs").exists():
        pytest.skip("needs root and the cgroup2 hierarchy at /sys/fs/cgroup/unified")
    base = UNIFIED / f"adl-test-cg2-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    try:
        yield base
    finally:
        for directory in (base / cgroups.LEAF, base):
            if directory.is_dir():
                with contextlib.suppress(OSError):
                    (directory / "cgroup.kill").write_text("1")
        deadline = time.monotonic() + 5
        for directory in (base / cgroups.LEAF, base):
            while directory.is_dir() and time.monotonic() < deadline:
                try:
                    directory.rmdir()
                except OSError:
                    time.sleep(0.01)
        assert not base.exists(), f"{base} left behind"


def test_move_into_leaf_on_the_real_cgroup2_hierarchy(own_unified_cgroup: Path) -> None:
    base = own_unified_cgroup
    name = f"/{base.name}"
    children = []
    try:
        # A process that keeps forking, and a quiet one: all of them end up in the leaf.
        for argv in (["sh", "-c", "while :; do /bin/true; done"], ["sleep", "60"]):
            child = subprocess.Popen(argv)
            children.append(child)
            (base / "cgroup.procs").write_text(str(child.pid))
        assert not cgroups.delegated(base)
        os.setxattr(base, "trusted.delegate", b"1")
        assert cgroups.delegated(base)
        assert cgroups.move_into_leaf(base) == ()  # the unified hierarchy here has no controllers
        assert (base / "cgroup.procs").read_text() == ""
        in_leaf = set((base / cgroups.LEAF / "cgroup.procs").read_text().split())
        assert {str(c.pid) for c in children} <= in_leaf
        for child in children:
            assert f"0::{name}/{cgroups.LEAF}\n" in Path(f"/proc/{child.pid}/cgroup").read_text()
        # Seen from the leaf, the session groups go beside it.
        assert cgroups._v2_base(UNIFIED, f"{name}/{cgroups.LEAF}") == base
        # A limit whose controller the cgroup lacks is refused with the reason, on the real cgroupfs.
        session = base / "g" / "s1"
        session.mkdir(parents=True)
        with pytest.raises(cgroups.CgroupError, match="the memory controller is not enabled"):
            cgroups.CgroupV2(session).apply(Limits(memory_bytes=64 << 20))
        session.rmdir()
        session.parent.rmdir()
    finally:
        for child in children:
            child.kill()
            child.wait()
