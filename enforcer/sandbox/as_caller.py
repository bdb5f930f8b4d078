"""Open a directory with another account's filesystem credentials, from a thread of this process.

Linux credentials belong to each thread; glibc makes setuid(2), setgroups(2) and their kin apply to
every thread, but setfsuid(2), setfsgid(2) and the raw setgroups system call change the calling
thread only, as does capset(2). A short-lived thread that takes the caller's fsuid, fsgid, no
supplementary groups and no effective capabilities walks a path with exactly the caller's
permissions, without forking this process. The thread shares this process's descriptors and working
directory, which /proc's magic links (/proc/self/fd/N, /proc/self/cwd, /proc/PID/root) would open
without any permission check: openat2(2) with RESOLVE_NO_MAGICLINKS refuses to follow them at all.

`open_directory` raises `Unsupported` where this cannot be done (another architecture, a kernel
before openat2): the caller then looks the path up in a child process instead.

A lookup on a filesystem that does not answer (a hung network or FUSE mount the caller names) would
hold the launch, and the launch's slot, for as long as the mount hangs: the wait is bounded
(LOOKUP_TIMEOUT_S) and the launch refused. A thread cannot be stopped from outside, so the lookup
thread is left to its hung system call; if that ever returns, the thread closes what it opened.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading

_MACHINE = os.uname().machine  # platform.machine() is this, behind a module that costs milliseconds
_SYS_SETGROUPS = {"x86_64": 116, "aarch64": 159}.get(_MACHINE)
_SYS_OPENAT2 = 437  # the same on every architecture
_RESOLVE_NO_MAGICLINKS = 0x02
_libc = ctypes.CDLL(None, use_errno=True)

LOOKUP_TIMEOUT_S = 10.0  # a working directory not found by then is on a filesystem that does not answer


class Unsupported(Exception):
    """No per-thread lookup here: look the path up in a child process."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


_CAPABILITY_VERSION_3 = 0x20080522


def _thread_credentials() -> tuple[list[str], list[str], str, int]:
    """(Uid line, Gid line, Groups line, effective capabilities) of this thread, as the kernel holds them."""
    with open("/proc/thread-self/status") as f:
        fields = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    groups = fields.get("Groups", "").strip()
    return fields["Uid"].split(), fields["Gid"].split(), groups, int(fields["CapEff"], 16)


def _drop_effective_capabilities() -> None:
    """This thread only (capset(2) is per thread, and the libc wrapper does not broadcast it)."""
    header = _CapHeader(_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capget(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capget: {os.strerror(err)}")
    for half in data:
        half.effective = 0
    if _libc.capset(ctypes.byref(header), data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")


def _become(uid: int, gid: int) -> None:
    """This thread only: no supplementary groups, fsgid `gid`, fsuid `uid`; checked with the kernel."""
    if _SYS_SETGROUPS is None:
        raise Unsupported(f"the setgroups system call's number on {_MACHINE}")
    if _libc.syscall(_SYS_SETGROUPS, 0, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setgroups: {os.strerror(err)}")
    _libc.setfsgid(gid)
    _libc.setfsuid(uid)
    # Only the filesystem capabilities follow fsuid: root's others (CAP_SYS_PTRACE passes /proc's
    # hidepid checks, for one) must lend the lookup nothing either. Last: the calls above need some.
    _drop_effective_capabilities()
    uids, gids, groups, capabilities = _thread_credentials()
    if uids[3] != str(uid) or gids[3] != str(gid) or groups or capabilities:
        raise OSError(
            errno.EPERM, f"the lookup thread did not take uid {uid}, gid {gid}, no groups and no capabilities"
        )


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


_PROC_SUPER_MAGIC = 0x9FA0


def on_proc(fd: int) -> bool:
    """Whether descriptor `fd` is on a proc filesystem (statfs's f_type, its first member)."""
    buffer = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if _libc.fstatfs(fd, buffer) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"fstatfs: {os.strerror(err)}")
    return ctypes.c_long.from_buffer(buffer).value == _PROC_SUPER_MAGIC


def open_directory(path: str, uid: int, gid: int, timeout_s: float | None = None) -> int:
    """An O_PATH descriptor of directory `path` as found by uid/gid without supplementary groups;
    OSError if that account cannot reach and enter it (or it is reached only through a magic link),
    or (ETIMEDOUT) if the lookup has not returned within `timeout_s` (LOOKUP_TIMEOUT_S)."""
    limit = LOOKUP_TIMEOUT_S if timeout_s is None else timeout_s
    result: list[int] = []
    failure: list[BaseException] = []
    handed = threading.Lock()  # the descriptor goes to the caller, or is closed once it has left
    abandoned = False

    def lookup() -> None:
        try:
            _become(uid, gid)
            fd = _open(path)
        except BaseException as exc:  # handed to the caller's thread
            failure.append(exc)
            return
        with handed:
            if abandoned:
                os.close(fd)
            else:
                result.append(fd)

    # The thread ends with the lookup: its credentials are never used again. A daemon thread: one
    # left in a hung lookup must not keep its process from exiting.
    thread = threading.Thread(target=lookup, name="cwd-as-caller", daemon=True)
    thread.start()
    thread.join(limit)
    with handed:
        if not result and not failure:
            abandoned = True
            raise OSError(
                errno.ETIMEDOUT, f"its lookup did not return within {limit:g} s (a filesystem that does not answer)"
            )
    if failure:
        raise failure[0]
    return result[0]
