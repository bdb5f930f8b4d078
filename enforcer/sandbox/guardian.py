"""The guardian: removes a session's cgroup, killing everything in it, once its launcher is gone.

stage.prepare() forks it and execs it as `python -S -I -c CODE FD`, CODE being this file as the
launcher read it when it loaded stage.py: a fork of the launcher would keep a private copy of every
page the launcher writes afterwards, for the whole session, while a fresh interpreter running this
file holds a few. So this file imports nothing but
the standard library's built-in modules, and no other module of the project.

The launcher holds the other end of socket FD. It sends the session's cgroup as frames (a 4-byte
big-endian length, then NUL-separated entries: `d` + a directory of the group, `k` + a cgroup.kill
file to use when it exists); the last whole frame counts. End of stream, by the launcher's release
or its death (even by SIGKILL), makes the guardian kill every member and remove the directories,
as cgroups.Cgroup.remove does. It writes one byte on FD when it is running, which the launcher
waits for before it starts the agent.

The daemon's spawner, which removes each daemon session's cgroup itself when the session's
supervisor ends, starts one guardian for all of them: its frame names the directories that hold
the sessions (`s` entries), and at end of stream (the spawner gone) every session found below them
is killed and removed.
"""

from __future__ import annotations

import errno
import os
import struct
import sys
import time

TYPE_CHECKING = False  # typing is not loaded either
if TYPE_CHECKING:
    import signal
    from collections.abc import Callable, Sequence
else:  # the built-in module under `signal`, which builds enums of its constants: most of what this
    import _signal as signal  # process would otherwise hold in memory for the session's life

READY = b"R"
_HEADER = struct.Struct("!I")
REMOVE_TIMEOUT_S = 10.0


def encode(directories: list[str], kill_files: list[str], sessions_in: tuple[str, ...] = ()) -> bytes:
    """The frame body the launcher sends for a cgroup (`sessions_in`: the spawner's, see above)."""
    entries = [b"d" + os.fsencode(d) for d in directories] + [b"k" + os.fsencode(k) for k in kill_files]
    entries += [b"s" + os.fsencode(s) for s in sessions_in]
    if any(b"\0" in entry for entry in entries):
        raise ValueError("a cgroup path holds a NUL byte")
    return b"\0".join(entries)


def decode_last(stream: bytes) -> tuple[list[str], list[str]] | None:
    """The last whole frame of `stream` as (directories, kill files); None without one. A frame of
    `s` entries decodes to the sessions below those directories, as found now."""
    last = None
    at = 0
    while at + _HEADER.size <= len(stream):
        (size,) = _HEADER.unpack_from(stream, at)
        if at + _HEADER.size + size > len(stream):
            break  # cut short: the launcher died while sending it
        last = stream[at + _HEADER.size : at + _HEADER.size + size]
        at += _HEADER.size + size
    if last is None:
        return None
    directories: list[str] = []
    kill_files: list[str] = []
    sessions_in: list[str] = []
    for entry in last.split(b"\0") if last else []:
        kind = entry[:1]
        (directories if kind == b"d" else sessions_in if kind == b"s" else kill_files).append(os.fsdecode(entry[1:]))
    if sessions_in:
        return sessions_below(sessions_in)
    return directories, kill_files


def sessions_below(parents: list[str]) -> tuple[list[str], list[str]]:
    """Every session directory below `parents` (one per hierarchy), and their cgroup.kill files."""
    directories: list[str] = []
    for parent in parents:
        try:
            with os.scandir(parent) as entries:
                directories += sorted(e.path for e in entries if e.is_dir(follow_symlinks=False))
        except FileNotFoundError:
            continue
    kill_files = [k for k in (os.path.join(d, "cgroup.kill") for d in directories) if os.path.exists(k)]
    return directories, kill_files


def members(directories: list[str]) -> list[int]:
    pids: set[int] = set()
    for directory in directories:
        try:
            with open(os.path.join(directory, "cgroup.procs")) as f:
                # A member outside this process's PID namespace is listed as 0: kill(0) would
                # signal this process's own group (the daemon), never the member.
                pids.update(pid for pid in map(int, f.read().split()) if pid > 0)
        except FileNotFoundError:
            continue
    return sorted(pids)


def kill_all(directories: list[str], kill_files: list[str]) -> None:
    """cgroup.kill where the group has one (double-forked members included); else SIGKILL each member.
    Several sessions (the spawner's guardian): each kill file is written, and each member killed
    unless every kill file was."""
    written = 0
    for path in kill_files:
        try:
            with open(path, "w") as f:
                f.write("1")
            written += 1
        except OSError:
            continue
    if kill_files and written == len(kill_files):
        return
    for pid in members(directories):
        try:  # noqa: SIM105 - contextlib is not loaded in a bare interpreter: kept that way
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def remove(directories: list[str], kill_files: list[str], timeout: float = REMOVE_TIMEOUT_S) -> None:
    """Kill what is left, wait for it to go, remove the directories (bounded wait)."""
    empty_and_remove(
        directories, lambda: members(directories), lambda: kill_all(directories, kill_files), timeout, OSError
    )


def empty_and_remove(
    directories: Sequence[str | os.PathLike[str]],
    listed: Callable[[], list[int]],
    kill: Callable[[], None],
    timeout: float,
    error: type[OSError],
) -> None:
    """Kill the members (`listed`, `kill`) until none is left, then remove `directories`, raising
    `error` (EBUSY) past `timeout`; cgroups.Cgroup.remove does the same through its own members and
    kill. A process may join after the last kill (a small init joins once its interpreter runs):
    the rmdir then finds the group busy, and its members are killed again until the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        while listed():
            kill()
            if time.monotonic() > deadline:
                raise error(errno.EBUSY, f"processes still in {directories[0]}: {listed()}")
            time.sleep(0.01)
        busy = None
        for directory in reversed(directories):
            try:
                os.rmdir(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    raise
                busy = directory
        if busy is None:
            return
        if time.monotonic() > deadline:
            raise error(errno.EBUSY, f"{busy} stays busy")
        time.sleep(0.01)


def main(fd: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's signals are not for the guardian
    try:  # noqa: SIM105 - as above
        os.write(fd, READY)
    except OSError:
        pass  # the launcher is gone already: what it sent is still to be read
    stream = b""
    try:
        while chunk := os.read(fd, 65536):
            stream += chunk
    except OSError:
        pass  # a reset is an end of stream too
    group = decode_last(stream)
    if group is not None and group[0]:
        remove(*group)


if __name__ == "__main__":
    main(int(sys.argv[1]))
