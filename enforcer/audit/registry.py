"""Who writes the log. Each live writer holds a flock on its own entry in writers/; an entry nobody
holds belongs to a writer that stopped without closing. Appends are ordered across writers by a
flock on audit.lock, held as a lease (see Lease)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

WRITERS_DIR = "writers"
APPEND_LOCK = "audit.lock"


class Lease:
    """The exclusive flock on audit.lock: whoever holds it may append."""

    __slots__ = ("_fd", "held")

    def __init__(self, directory: Path) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # never a file a planted link names
        self._fd = os.open(directory / APPEND_LOCK, flags, 0o640)
        self.held = False

    def take(self) -> bool:
        """Wait for the lease. Whether it was newly taken (then others may have appended meanwhile)."""
        if self.held:
            return False
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        self.held = True
        return True

    def release(self) -> None:
        if self.held:
            self.held = False
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self._fd)


def _open_registry(directory: Path) -> int:
    """writers/, never through a symlink: whoever can write the directory may plant one there, and
    root would list, create and remove entries in the directory it names."""
    return os.open(directory / WRITERS_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def register(directory: Path, writer_id: str, started: str) -> int:
    """Enter a writer in the registry; it stays live while the returned descriptor is open."""
    registry_fd = _open_registry(directory)
    try:
        fd = os.open(writer_id, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640, dir_fd=registry_fd)
    finally:
        os.close(registry_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, orjson.dumps({"writer": writer_id, "pid": os.getpid(), "started": started}))
    except OSError:
        os.close(fd)
        raise
    return fd


def unregister(directory: Path, writer_id: str, fd: int) -> None:
    try:  # removed while still locked: another writer would report an unlocked entry as dead
        registry_fd = _open_registry(directory)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(writer_id, dir_fd=registry_fd)
        finally:
            os.close(registry_fd)
    finally:
        os.close(fd)


def dead_writers(directory: Path) -> Iterator[dict[str, Any]]:
    """What each dead writer's entry says (writer, pid, started); the entry is removed once the
    caller resumes the iteration, that is after it has recorded the death. Call under the lease, so
    that two writers do not both report one death."""
    registry_fd = _open_registry(directory)
    try:
        yield from _dead_entries(registry_fd)
    finally:
        os.close(registry_fd)


def _dead_entries(registry_fd: int) -> Iterator[dict[str, Any]]:
    for name in sorted(os.listdir(registry_fd)):
        # Whoever can write the directory may plant anything here: never followed (root would open,
        # lock and record a file it names), never waited on (a FIFO's read would not end). What is
        # no regular file is no writer's entry: recorded as one that names nothing, and removed.
        try:
            fd = os.open(name, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=registry_fd)
        except OSError as exc:
            if exc.errno not in (errno.ELOOP, errno.ENXIO):  # a symlink, a socket; else the directory's fault
                raise
            fd = -1
        try:
            if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
                yield {"writer": name, "pid": None, "started": None}
                os.unlink(name, dir_fd=registry_fd)
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer
            try:
                info = orjson.loads(os.read(fd, 4096) or b"{}")
            except orjson.JSONDecodeError:
                info = {}
            yield {"writer": info.get("writer", name), "pid": info.get("pid"), "started": info.get("started")}
            os.unlink(name, dir_fd=registry_fd)
        finally:
            if fd >= 0:
                os.close(fd)
