"""Namespaces, mounts and privilege dropping through libc (Python 3.11 has no os.unshare).
Everything here runs in the forked child before exec."""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
SECBIT_NOROOT_LOCKED_ALL = 0x2F  # noroot, no_setuid_fixup and keep_caps, each locked
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), "unshare")


def setns(fd: int, nstype: int) -> None:
    """Move the calling thread into the namespace `fd` refers to."""
    _check(_libc.setns(ctypes.c_int(fd), ctypes.c_int(nstype)), "setns")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    def enc(s: str | None) -> bytes | None:
        return s.encode() if s is not None else None

    _check(_libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {target}")


def make_mounts_private() -> None:
    """Nothing mounted here propagates back to the host."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)


def mask_file(path: str) -> None:
    """Bind an empty, read-only /dev/null over a file."""
    mount("/dev/null", path, None, MS_BIND)
    mount(None, path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def mask_dir(path: str) -> None:
    """Cover a directory with an empty, read-only tmpfs nobody can write."""
    mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=4k,mode=000")


def mount_proc(pid: int) -> None:
    """A /proc of the calling process's PID namespace over the host's (the caller must be in that
    namespace). hidepid=2: processes of other uids (the namespace's init, run as root) are invisible.
    The mount table of the namespace is masked in `pid`'s entry (the only one its Landlock domain
    reads): it names host paths outside the grants and every masked denied path. Each thread has a
    copy under task/, so task/ is masked whole: programs lose per-thread /proc introspection."""
    mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, "hidepid=2")
    for name in ("mountinfo", "mounts", "mountstats"):
        mask_file(f"/proc/{pid}/{name}")
    mask_dir(f"/proc/{pid}/task")


def loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s.fileno(), SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def drop_agent_privileges(uid: int | None, gid: int | None) -> None:
    """drop_privileges(), and the agent never keeps host uid or gid 0: root without capabilities
    still owns root's files, and chmod, chown-to-self, xattrs and ACLs are not Landlock rights."""
    drop_privileges(uid, gid)
    if 0 in os.getresuid() or 0 in os.getresgid():
        raise PermissionError("the agent never runs as host uid or gid 0 (no identity to switch to)")


def drop_privileges(uid: int | None, gid: int | None) -> None:
    """Switch to uid/gid when asked and drop every capability from every set, locked so exec cannot
    grant them back."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last_cap = int(f.read())
    if os.geteuid() == 0:
        # While CAP_SETPCAP is still held; NO_SETUID_FIXUP keeps the effective set across the uid
        # switch below, and capset() then clears it explicitly.
        for cap in range(last_cap + 1):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        _check(_libc.prctl(PR_SET_SECUREBITS, SECBIT_NOROOT_LOCKED_ALL, 0, 0, 0), "securebits")
    if gid is not None:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
    if uid is not None:
        os.setresuid(uid, uid, uid)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_libc.capset(ctypes.byref(header), data), "capset")
