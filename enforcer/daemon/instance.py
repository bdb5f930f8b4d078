"""One adl-enforcerd per socket and per session cgroup directory.

A second daemon started on the same configuration (or sharing a socket or the cgroup group with a
running one) would take over the first one's sockets and reap its live sessions as leftovers of a
crash. Each daemon therefore holds an exclusive flock on a lock file beside each of its sockets and
one for its cgroup group in the runtime directory, for as long as it runs; a daemon that cannot
take one refuses to start and names the holder. The kernel drops the locks when the process dies,
so a crash never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path


class InstanceLocked(Exception):
    """Another daemon holds one of the locks."""


class InstanceLock:
    def __init__(self, paths: list[Path]) -> None:
        self.paths = paths
        self._held: list[tuple[Path, int]] = []

    def acquire(self) -> None:
        try:
            for path in self.paths:
                self._held.append((path, _lock(path)))
        except BaseException:
            self.release()
            raise

    def descriptors(self) -> list[int]:
        """The lock files' descriptors: a child forked while they are held closes its copies."""
        return [fd for _, fd in self._held]

    def release(self) -> None:
        """Remove the lock files (while still holding them: see _lock) and let them go."""
        for path, fd in reversed(self._held):
            with contextlib.suppress(OSError):
                if os.fstat(fd).st_ino == os.stat(path).st_ino:
                    path.unlink()
            os.close(fd)
        self._held.clear()


def lock_paths(sockets: list[Path], runtime_dir: Path, cgroup_group: str) -> list[Path]:
    return [*(p.with_name(p.name + ".lock") for p in sockets), runtime_dir / f"cgroup-{cgroup_group}.lock"]


def _lock(path: Path) -> int:
    """An exclusive flock on `path`, with our pid written in it. A holder removes its file on exit
    while still locking it, so a lock taken on a file that is no longer at `path` is retried."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    for _ in range(5):
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise InstanceLocked(f"cannot lock {path}: {exc.strerror}") from None
            raise InstanceLocked(
                f"another adl-enforcerd{holder} holds {path}: it serves this socket or session cgroup group. "
                "Stop it first, or give this one its own socket, admin_socket, launch_socket and cgroup_group"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            return fd
        os.close(fd)
    raise InstanceLocked(f"cannot lock {path}: it keeps being replaced")


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return f" (pid {pid})" if pid.isdigit() else ""
