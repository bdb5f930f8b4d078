"""One adl-enforcerd per socket and cgroup group: the instance locks."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from enforcer.daemon.instance import InstanceLock, InstanceLocked, lock_paths


def test_a_second_holder_is_refused_and_named_until_the_first_lets_go(tmp_path: Path) -> None:
    paths = lock_paths([tmp_path / "run" / "api.sock", tmp_path / "run" / "admin.sock"], tmp_path / "rt", "grp")
    assert [p.name for p in paths] == ["api.sock.lock", "admin.sock.lock", "cgroup-grp.lock"]
    first = InstanceLock(paths)
    first.acquire()
    assert paths[0].read_text() == f"{os.getpid()}\n"
    # another process: flock locks belong to the open file, so a second open in this one would do too,
    # but a process is what a second daemon is
    holder = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from enforcer.daemon.instance import InstanceLock, InstanceLocked
        try:
            InstanceLock([Path({str(paths[2])!r})]).acquire()
        except InstanceLocked as exc:
            print(exc)
            sys.exit(3)
        """
    )
    second = subprocess.run([sys.executable, "-c", holder], capture_output=True, text=True, timeout=30)
    assert second.returncode == 3, second.stderr
    assert f"another adl-enforcerd (pid {os.getpid()}) holds {paths[2]}" in second.stdout
    with pytest.raises(InstanceLocked):
        InstanceLock(paths[1:2]).acquire()  # a second open file description in this process is refused too
    first.release()
    assert not any(p.exists() for p in paths)  # removed while still held, so nobody locks a stale file
    again = InstanceLock(paths)
    again.acquire()
    again.release()


def test_a_failed_acquire_lets_go_of_what_it_took(tmp_path: Path) -> None:
    taken = InstanceLock([tmp_path / "b.lock"])
    taken.acquire()
    partial = InstanceLock([tmp_path / "a.lock", tmp_path / "b.lock"])
    with pytest.raises(InstanceLocked):
        partial.acquire()
    assert not (tmp_path / "a.lock").exists()  # released and removed
    taken.release()
