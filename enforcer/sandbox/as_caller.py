"""Open a directory with another account's filesystem credentials, from a thread of this process.

Linux credentials belong to each thread; glibc makes setuid(2), setgroups(2) and their kin apply to
every thread, but setfsuid(2), setfsgid(2) and the raw setgroups system call change the calling
thread only. A short-lived thread that takes the caller's fsuid, fsgid and no supplementary groups
walks a path with exactly the caller's permissions (setting a non-zero fsuid also clears
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and the other filesystem capabilities from its effective
set), without forking this process. The thread shares this process's descriptors and working
directory, which /proc's magic links (/proc/self/fd/N, /proc/self/cwd, /proc/PID/root) would open
without any permission check: openat2(2) with RESOLVE_NO_MAGICLINKS refuses to follow them at all.

`open_directory` raises `Unsupported` where this cannot be done (another architecture, a kernel
before openat2): the caller then looks the path up in a child process instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import threading

_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(platform.machine())
_SYS_OPENAT2 = 437  # the same on every architecture
_RESOLVE_NO_MAGICLINKS = 0x02
_libc = ctypes.CDLL(None, use_errno=True)


class Unsupported(Exception):
    """No per-thread lookup here: look the path up in a child process."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def _thread_credentials() -> tuple[list[str], list[str], str]:
    """(Uid line, Gid line, Groups line) of this thread, as the kernel holds them."""
    with open("/proc/thread-self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    return fields["Uid"].split(), fields["Gid"].split(), fields.get("Groups", "").strip()


def _become(uid: int, gid: int) -> None:
    """This thread only: no supplementary groups, fsgid `gid`, fsuid `uid`; checked with the kernel."""
    if _SYS_SETGROUPS is None:
        raise Unsupported(f"the setgroups system call's number on {platform.machine()}")
    if _libc.syscall(_SYS_SETGROUPS, 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    uids, gids, groups = _thread_credentials()
    if uids[3] != str(uid) or gids[3] != str(gid) or groups:
        raise OSError(errno.EPERM, f"the lookup thread did not take uid {uid}, gid {gid} and no groups")


def _open(path: str) -> int:
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # a relative path starts at /
    try:
        named = _openat2(root, path)
    finally:
        os.close(root)
    try:
        # O_PATH checks no permission on the last component: "." from it needs the search
        # permission cd needs, so a directory the caller may name but not enter is refused.
        return _openat2(named, ".")
    finally:
        os.close(named)


def _openat2(directory: int, path: str) -> int:
    how = _OpenHow(os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, 0, _RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(_SYS_OPENAT2, directory, os.fsencode(path), ctypes.byref(how), ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err == errno.ENOSYS:
            raise Unsupported("openat2")
        raise OSError(err, os.strerror(err), path)
    return int(fd)


def open_directory(path: str, uid: int, gid: int) -> int:
    """An O_PATH descriptor of directory `path` as found by uid/gid without supplementary groups;
    OSError if that account cannot reach and enter it (or it is reached only through a magic link)."""
    result: list[int] = []
    failure: list[BaseException] = []

    def lookup() -> None:
        try:
            _become(uid, gid)
            result.append(_open(path))
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)

    # The thread ends with the lookup: its credentials are never used again.
    thread = threading.Thread(target=lookup, name="cwd-as-caller")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]
