"""File accesses of a session, observed from the host with fanotify (learn mode only).

Landlock has no audit-only mode, so a learning run widens Landlock and watches instead: a
notification-class fanotify group marks every real filesystem's superblock (so the copies of its
mounts in the agent's mount namespace are covered too) for opens, executions and writes, and keeps
the events of processes in the session's cgroup. Needs CAP_SYS_ADMIN; Python 3.11 has no binding,
hence ctypes. Each event carries an open descriptor of the object, which is read and closed at once.

What is kept is bounded (Observed.add): the agent may create names by the million, and this
process runs as root for the whole run. A directory keeps its first MAX_NAMES_PER_DIRECTORY names of
each kind and is noted as crowded beyond them; past MAX_PATHS names (or MAX_PATH_CHARACTERS of them)
in all, nothing more is kept and the observation says it is truncated.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import posixpath
import select
import struct
import threading
from dataclasses import dataclass, field

from .proc_events import ForkEvents

_SYS_FANOTIFY_INIT = {"x86_64": 300, "aarch64": 262}.get(os.uname().machine, -1)
_SYS_FANOTIFY_MARK = {"x86_64": 301, "aarch64": 263}.get(os.uname().machine, -1)
FAN_CLASS_NOTIF = 0x0
FAN_CLOEXEC = 0x1
FAN_NONBLOCK = 0x2
FAN_MARK_ADD = 0x1
FAN_MARK_FILESYSTEM = 0x100
FAN_OPEN = 0x20
FAN_CLOSE_WRITE = 0x8
FAN_OPEN_EXEC = 0x1000
FAN_ONDIR = 0x40000000
FAN_Q_OVERFLOW = 0x4000
_EVENT = struct.Struct("=IBBHQii")
_AT_FDCWD = -100
# Filesystems without files an agent could be granted.
_SKIP_FS = frozenset(
    {"proc", "sysfs", "cgroup", "cgroup2", "devpts", "mqueue", "debugfs", "tracefs", "securityfs", "pstore", "bpf"}
    | {"configfs", "fusectl", "hugetlbfs", "binfmt_misc", "autofs", "rpc_pipefs", "nsfs", "efivarfs"}
)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class FanotifyUnavailable(OSError):
    pass


# A directory's names of one kind kept before it counts as crowded: far more than learn's collapse
# needs to grant it as a whole (policy.learn.collapse), few enough that a flood costs little.
MAX_NAMES_PER_DIRECTORY = 256
MAX_PATHS = 100_000  # names of every kind together; beyond, the observation is truncated
# Their characters together (the directories the bounds count by included): a name may be PATH_MAX
# long, and as many long names would hold hundreds of megabytes in this root process.
MAX_PATH_CHARACTERS = 16 << 20
# Fork links kept to place a process gone before its events are read (the agent forks as often as it
# likes): past this many they are all forgotten, and counted (Observed.forks_forgotten).
MAX_FORK_LINKS = 65536


@dataclass
class Observed:
    read: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)
    executed: set[str] = field(default_factory=set)
    directories: set[str] = field(default_factory=set)
    overflowed: bool = False
    forks_untracked: bool = False  # no fork events: a process gone before its events are read is missed
    events: int = 0
    crowded: dict[str, set[str]] = field(default_factory=dict)  # directory: the kinds it had too many names of
    truncated: bool = False  # MAX_PATHS names (or MAX_PATH_CHARACTERS) were kept: the others were not
    # Fork links dropped at MAX_FORK_LINKS: a process of theirs gone before its events were read
    # could not be placed, and what it touched is missing.
    forks_forgotten: int = 0
    _per_directory: dict[tuple[str, str], int] = field(default_factory=dict, repr=False)
    _kept: int = 0
    _characters: int = 0

    def add(self, kind: str, path: str) -> None:
        """Keep `path` in the set `kind` (read, written, executed, directories), within the bounds."""
        names: set[str] = getattr(self, kind)
        if path in names:
            return
        if self._kept >= MAX_PATHS:
            self.truncated = True
            return
        key = (kind, posixpath.dirname(path))
        count = self._per_directory.get(key, 0)
        if count >= MAX_NAMES_PER_DIRECTORY:
            self.crowded.setdefault(key[1], set()).add(kind)
            return
        characters = len(path) + (0 if count else len(key[1]))  # a new directory is kept as a key too
        if self._characters + characters > MAX_PATH_CHARACTERS:
            self.truncated = True
            return
        self._per_directory[key] = count + 1
        names.add(path)
        self._kept += 1
        self._characters += characters


def _mount_points() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fstype = right.split(" ", 1)[0]
            if fstype in _SKIP_FS:
                continue
            mount_point = left.split(" ")[4].replace("\\040", " ")
            points.append(mount_point)
    return points


class Observer:
    """Start before the agent runs, stop after its cgroup is gone; `observed` holds the paths."""

    def __init__(self, cgroup_marker: str) -> None:
        if _SYS_FANOTIFY_INIT < 0:
            raise FanotifyUnavailable(38, "fanotify syscall numbers unknown on this architecture")
        fd = _libc.syscall(
            _SYS_FANOTIFY_INIT,
            # The kernel's bounded queue: the marks see every process on the host, and an unlimited
            # queue behind a slow reader would grow in kernel memory. An overflow is reported.
            ctypes.c_uint(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK),
            ctypes.c_uint(os.O_RDONLY | os.O_LARGEFILE | os.O_CLOEXEC),
        )
        if fd < 0:
            err = ctypes.get_errno()
            raise FanotifyUnavailable(err, f"fanotify_init: {os.strerror(err)}")
        self.fd = int(fd)
        self.marker = cgroup_marker
        self.observed = Observed()
        self._members: dict[int, bool] = {}
        self._seen_devices: set[int] = set()
        mask = FAN_OPEN | FAN_OPEN_EXEC | FAN_CLOSE_WRITE | FAN_ONDIR
        for point in _mount_points():
            try:
                dev = os.stat(point).st_dev
            except OSError:
                continue
            if dev in self._seen_devices:
                continue
            result = _libc.syscall(
                _SYS_FANOTIFY_MARK,
                ctypes.c_int(self.fd),
                ctypes.c_uint(FAN_MARK_ADD | FAN_MARK_FILESYSTEM),
                ctypes.c_uint64(mask),
                ctypes.c_int(_AT_FDCWD),
                point.encode(),
            )
            if result == 0:
                self._seen_devices.add(dev)
        if not self._seen_devices:
            os.close(self.fd)
            raise FanotifyUnavailable(1, "fanotify: no filesystem could be marked")
        # Forks, to place a process that is gone by the time its events are read (see proc_events).
        self._parents: dict[int, tuple[int, int]] = {}  # child: (parent, forks seen under its pid then)
        self._forks_of: dict[int, int] = {}  # pid: new processes seen under it
        self._forks: ForkEvents | None = None
        try:
            self._forks = ForkEvents()
        except OSError:
            self.observed.forks_untracked = True
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._thread = threading.Thread(target=self._run, name="fanotify", daemon=True)
        self._thread.start()

    def _member(self, pid: int) -> bool:
        known = self._members.get(pid)
        if known is not None:
            return known
        if len(self._members) > 65536:
            self._members.clear()
        member = self._in_session(pid)
        if member is None:
            member = self._forked_in_session(pid)
        self._members[pid] = member
        return member

    def _in_session(self, pid: int) -> bool | None:
        """Whether a live process is in the session's cgroup; None when it is gone."""
        try:
            with open(f"/proc/{pid}/cgroup", encoding="utf-8", errors="replace") as f:
                text = f.read(8192)
        except OSError:
            return None
        return any(line.endswith(self.marker) or self.marker + "/" in line for line in text.splitlines())

    def _forked_in_session(self, pid: int) -> bool:
        """A process that is gone belongs to the session when its nearest ancestor still known (a
        cached answer or a live process) does: the session's processes never leave its cgroup."""
        self._read_forks()
        seen = 0
        while seen < 64:
            link = self._parents.get(pid)
            if link is None:
                return False
            parent, forks = link
            if self._forks_of.get(parent, 0) != forks:
                return False  # the parent's pid is another process's now: it places nothing
            known = self._members.get(parent)
            if known is not None:
                return known
            member = self._in_session(parent)
            if member is not None:
                self._members[parent] = member
                return member
            pid, seen = parent, seen + 1
        return False

    def _read_forks(self) -> None:
        if self._forks is None:
            return
        if len(self._parents) > MAX_FORK_LINKS:
            self.observed.forks_forgotten += len(self._parents)
            self._parents.clear()
            self._forks_of.clear()
        for parent, child in self._forks.read():
            # With the forks seen so far under the parent's pid: once a new process takes that pid,
            # the link leads to a process that never was this child's parent.
            self._forks_of[child] = self._forks_of.get(child, 0) + 1
            self._parents[child] = (parent, self._forks_of.get(parent, 0))
            # A new process under a pid placed before: what was known of the pid was another
            # process's, and a session's pid reused by a host process must not stay in the session.
            self._members.pop(child, None)
        if self._forks.lost:
            self.observed.overflowed = True

    def _run(self) -> None:
        poller = select.poll()
        for fd in (self.fd, self._stop_r, *([self._forks.fileno()] if self._forks is not None else [])):
            poller.register(fd, select.POLLIN)
        while True:
            ready = {fd for fd, _ in poller.poll(500)}
            self._read_forks()
            if self.fd in ready:
                self._read()
            if self._stop_r in ready:
                self._read()
                return

    def _read(self) -> None:
        for _ in range(1024):
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            # The fork of each process behind these events was queued before them: read it before
            # placing their pids, or a pid reused since it was placed would keep its old place.
            self._read_forks()
            offset = 0
            while offset + _EVENT.size <= len(data):
                length, _, _, _, mask, fd, pid = _EVENT.unpack_from(data, offset)
                offset += max(length, _EVENT.size)
                if mask & FAN_Q_OVERFLOW:
                    self.observed.overflowed = True
                if fd < 0:
                    continue
                try:
                    if self._member(pid):
                        self._record(mask, fd)
                finally:
                    os.close(fd)

    def _record(self, mask: int, fd: int) -> None:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return
        if not path.startswith("/") or path.endswith(" (deleted)"):
            return
        self.observed.events += 1
        if mask & FAN_ONDIR:
            self.observed.add("directories", path)
        elif mask & FAN_OPEN_EXEC:
            self.observed.add("executed", path)
        elif mask & FAN_CLOSE_WRITE:
            self.observed.add("written", path)
        else:
            self.observed.add("read", path)

    def stop(self) -> Observed:
        os.write(self._stop_w, b"x")
        self._thread.join(10)
        for fd in (self.fd, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)
        if self._forks is not None:
            self._forks.close()
        return self.observed
