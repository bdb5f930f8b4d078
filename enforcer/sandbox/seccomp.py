"""The seccomp baseline every sandbox gets (DESIGN.md section 4), built with pyseccomp.

Default allow with a deny list: the agent runs arbitrary programs, so an allow list would break
them; what is denied is the kernel surface sandbox escapes go through. Denied calls fail with
EPERM; filters are loaded with SECCOMP_FILTER_FLAG_LOG, so the kernel audits those answers and the
session records them (kernel_audit.py). Argument compares use a 32-bit mask so garbage in the
upper half of a register cannot slip past; a foreign architecture kills the process.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import importlib
import os
import platform
import socket
import struct
import threading
from types import ModuleType
from typing import TYPE_CHECKING

from ..quick_dataclass import dataclass

# The calls the filter sends to the creation guard (creation_guard.py); here, so that a process
# building a plan or a filter does not load the guard.
#
# Syscalls whose calls create a name, with the argument positions of (dirfd, path) pairs; dirfd None
# means relative to the cwd. open/openat are only sent to the guard when O_CREAT is set (below).
GUARDED: dict[str, tuple[tuple[int | None, int], ...]] = {
    "open": ((None, 0),),
    "creat": ((None, 0),),
    "openat": ((0, 1),),
    "mkdir": ((None, 0),),
    "mkdirat": ((0, 1),),
    "mknod": ((None, 0),),
    "mknodat": ((0, 1),),
    "symlink": ((None, 1),),
    "symlinkat": ((1, 2),),
    "link": ((None, 0), (None, 1)),
    "linkat": ((0, 1), (2, 3)),
    "rename": ((None, 0), (None, 1)),
    "renameat": ((0, 1), (2, 3)),
    "renameat2": ((0, 1), (2, 3)),
}

# Metadata calls Landlock has no right for (mode, owner, times): the guard answers them only for
# files beneath a writable grant. name -> (dirfd argument, path argument, flags argument); no path
# argument: the call names the descriptor in the dirfd position.
METADATA: dict[str, tuple[int | None, int | None, int | None]] = {
    "chmod": (None, 0, None),
    "fchmod": (0, None, None),
    "fchmodat": (0, 1, None),
    "fchmodat2": (0, 1, 3),
    "chown": (None, 0, None),
    "lchown": (None, 0, None),
    "fchown": (0, None, None),
    "fchownat": (0, 1, 4),
    "utime": (None, 0, None),
    "utimes": (None, 0, None),
    "futimesat": (0, 1, None),
    "utimensat": (0, 1, 3),
}
# inotify reports the names of entries in a watched directory, and no Landlock right covers watching:
# a watch is added only on what the agent could open for reading.
WATCH = "inotify_add_watch"

# The sonames pyseccomp asks ctypes.util.find_library for when it is imported.
_SONAMES = {"c": "libc.so.6", "seccomp": "libseccomp.so.2"}
# One replacement at a time: a second thread would save the first one's as the usual lookup.
_REPLACING = threading.Lock()


@functools.cache
def pyseccomp() -> ModuleType:
    """pyseccomp, imported on first use: only a process that builds a filter or names syscalls
    loads it and libseccomp (a launcher whose stage builds its filter does neither).

    Imported without its two `ldconfig -p` runs (one per find_library call, in every process that
    imports it). find_library only names a soname, which pyseccomp then opens with
    dlopen; the dynamic loader resolves that soname from the same cache itself. So, while the module
    loads, a name in _SONAMES that the loader opens is answered with that soname (the library
    pyseccomp then loads is the one the loader just opened); any other name, or a soname the loader
    cannot open, goes to the usual lookup."""
    with _REPLACING:
        return _import_pyseccomp()


def _import_pyseccomp() -> ModuleType:
    import ctypes.util  # subprocess, shutil: only where pyseccomp is loaded

    usual = ctypes.util.find_library

    def find_library(name: str) -> str | None:
        soname = _SONAMES.get(name)
        if soname is not None:
            try:
                ctypes.CDLL(soname)
            except OSError:
                return usual(name)
            return soname
        return usual(name)

    ctypes.util.find_library = find_library
    try:
        return importlib.import_module("pyseccomp")
    finally:
        ctypes.util.find_library = usual


if TYPE_CHECKING:
    import pyseccomp as sc

# Syscalls denied outright, grouped by why.
DENIED_SYSCALLS: dict[str, tuple[str, ...]] = {
    "io_uring (bypasses seccomp and Landlock checks on its operations)": (
        "io_uring_setup",
        "io_uring_enter",
        "io_uring_register",
    ),
    "tracing and cross-process memory": ("ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd"),
    "kernel extension and introspection": ("bpf", "perf_event_open", "init_module", "finit_module", "delete_module"),
    "keyrings": ("keyctl", "add_key", "request_key"),
    "filesystem-wide watches (report names Landlock would hide)": ("fanotify_init", "fanotify_mark"),
    "mounts": (
        "mount",
        "umount2",
        "pivot_root",
        "move_mount",
        "open_tree",
        "fsopen",
        "fsconfig",
        "fsmount",
        "fspick",
        "mount_setattr",
    ),
    "namespaces": ("unshare", "setns"),
    "kernel replacement and machine state": ("kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff"),
    "exec of anonymous memory (memfd + execveat)": ("memfd_create", "execveat"),
    "privilege and time": (
        "acct",
        "settimeofday",
        "clock_settime",
        "adjtimex",
        "clock_adjtime",
        "quotactl",
        "lookup_dcookie",
        "userfaultfd",
        "open_by_handle_at",
        "name_to_handle_at",
        "personality",
        "uselib",
        "vhangup",
        "iopl",
        "ioperm",
        "syslog",
    ),
}
# clone/clone3 flags that create namespaces (clone3 passes flags in memory: denied entirely, so
# glibc falls back to clone, whose flags are checked here).
CLONE_NEW_NAMESPACES = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x00000080
)
DENIED_SOCKET_FAMILIES = {
    "AF_UNIX": socket.AF_UNIX,  # pathname sockets are not covered by Landlock; the daemon's socket is one
    "AF_NETLINK": socket.AF_NETLINK,
    "AF_PACKET": socket.AF_PACKET,
    "AF_VSOCK": 40,
    "AF_KEY": 15,
    "AF_BLUETOOTH": 31,
}
MASK32 = 0xFFFFFFFF
TIOCSTI = 0x5412
IPPROTO_MPTCP = 262  # Landlock's TCP bind/connect rules do not cover it
# Extended attributes (POSIX ACLs, security labels): no Landlock right covers setting them.
XATTR_WRITES = ("setxattr", "lsetxattr", "fsetxattr", "removexattr", "lremovexattr", "fremovexattr")
XATTR_WRITES_AT = {"setxattrat": 463, "removexattrat": 466}  # same number everywhere; libseccomp may not know them
# Newer calls libseccomp may not know, by their number (the same on every architecture): the mount
# table by syscall (what masking /proc/<pid>/mountinfo hides: host paths outside the grants and every
# masked denied path), and open_tree with mount attributes.
DENIED_BY_NUMBER = {
    "mount table (statmount, listmount)": {"statmount": 457, "listmount": 458},
    "mounts": {"open_tree_attr": 467},
}
# ioctls that change inode flags or make a file read-only for good: they need only ownership and a
# descriptor opened for reading, and no Landlock right covers them (EOPNOTSUPP, as for xattrs).
INODE_FLAG_IOCTLS = {
    "FS_IOC_SETFLAGS": 0x40086602,
    "FS_IOC32_SETFLAGS": 0x40046602,
    "FS_IOC_FSSETXATTR": 0x401C5820,
    "FS_IOC_SETVERSION": 0x40087602,
    "FS_IOC32_SETVERSION": 0x40047602,
    "FS_IOC_SET_ENCRYPTION_POLICY": 0x800C6613,
    "FS_IOC_ENABLE_VERITY": 0x40806685,
}
INODE_FLAG_CALLS = {"file_setattr": 469}  # FS_IOC_FSSETXATTR by path; by number, as for XATTR_WRITES_AT
# chmod calls and the argument holding the mode: a setuid or setgid bit is always refused.
CHMOD_MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2}
S_ISUID, S_ISGID = 0o4000, 0o2000


@dataclass(frozen=True)
class SeccompPlan:
    deny_unix_sockets: bool = True
    guard_creation: bool = False  # send name-creating calls to the creation guard (denied_paths)
    guard_metadata: bool = False  # send mode/owner/time changes and inotify watches to it (writable grants)

    @property
    def guarded(self) -> bool:
        return self.guard_creation or self.guard_metadata


def describe(plan: SeccompPlan) -> list[str]:
    lines = [f"{why}: {', '.join(calls)}" for why, calls in DENIED_SYSCALLS.items()]
    families = [f for f in DENIED_SOCKET_FAMILIES if plan.deny_unix_sockets or f != "AF_UNIX"]
    lines += [f"{why}: {', '.join(calls)}" for why, calls in DENIED_BY_NUMBER.items()]
    lines.append(
        f"sockets: {', '.join(families)}, SOCK_RAW of any family"
        + (
            "; socketpair(AF_UNIX, SOCK_DGRAM) (EAFNOSUPPORT); stream and seqpacket socketpairs stay allowed"
            if plan.deny_unix_sockets
            else ""
        )
    )
    lines.append("clone with namespace flags; clone3 (flags not inspectable); ioctl TIOCSTI")
    lines.append("MPTCP sockets (IPPROTO_MPTCP: EPROTONOSUPPORT, programs fall back to TCP)")
    lines.append(f"extended attributes and ACLs: {', '.join(XATTR_WRITES + tuple(XATTR_WRITES_AT))} (EOPNOTSUPP)")
    lines.append("chmod family with a setuid or setgid bit (EPERM)")
    lines.append(f"inode flags and fs-verity: {', '.join((*INODE_FLAG_IOCTLS, *INODE_FLAG_CALLS))} (EOPNOTSUPP)")
    metadata = ", ".join(METADATA)
    if plan.guard_metadata:
        lines.append(
            f"mode, owner and time changes ({metadata}) are performed by the guard only for files beneath a "
            "writable grant (EPERM elsewhere)"
        )
        lines.append("inotify_add_watch: added by the guard only on what the agent could open for reading")
    else:
        lines.append(f"mode, owner and time changes ({metadata}): EPERM (no writable grant)")
        lines.append("inotify_add_watch: EACCES (no writable grant, so no guard to check it)")
    lines.append("foreign architecture (32-bit syscall ABI): process killed")
    if plan.guard_creation:
        lines.append(
            "name-creating calls (open/openat/creat with O_CREAT, mkdir, mknod, link, symlink, rename) "
            "are checked and performed by the creation guard; openat2 answers ENOSYS (its flags are not "
            "inspectable), so programs fall back to openat"
        )
    return lines


def variants() -> list[SeccompPlan]:
    """Every plan a launch can ask for."""
    return [
        SeccompPlan(deny_unix_sockets=unix, guard_creation=names, guard_metadata=metadata)
        for unix in (True, False)
        for names, metadata in ((False, False), (False, True), (True, True))
    ]


@functools.cache
def compile_filter(plan: SeccompPlan) -> bytes:
    """The BPF program, built once per plan and process (libseccomp's rule compiler is the slow part
    of loading); the launch stage builds them while it waits for its order."""
    f = _build(plan)
    with open(os.memfd_create("adl-seccomp-bpf", os.MFD_CLOEXEC), "w+b") as out:  # no file system round trip
        f.export_bpf(out)
        out.seek(0)
        return out.read()


# <linux/seccomp.h>
_SECCOMP_SET_MODE_FILTER = 1
_FLAG_NEW_LISTENER = 1 << 3
_FLAG_LOG = 1 << 1  # denials (ERRNO answers) go to the kernel audit log: see kernel_audit.py
_FLAG_WAIT_KILLABLE_RECV = 1 << 5  # once the guard has the call, only a fatal signal interrupts it
_SYS_SECCOMP = {"x86_64": 317, "aarch64": 277}.get(platform.machine(), -1)
_libc = ctypes.CDLL(None, use_errno=True)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def load(bpf: bytes, *, listener: bool) -> int:
    """Install a compiled program in the calling process (no_new_privs must be set). Returns the
    notification listener descriptor when `listener`, else -1."""
    if _SYS_SECCOMP < 0:
        raise OSError(errno.ENOSYS, f"seccomp syscall number unknown on {platform.machine()}")
    prog = _SockFprog(len(bpf) // 8, bpf)
    flags = _FLAG_NEW_LISTENER | _FLAG_WAIT_KILLABLE_RECV if listener else 0
    flags |= _FLAG_LOG
    result = _libc.syscall(_SYS_SECCOMP, _SECCOMP_SET_MODE_FILTER, ctypes.c_uint(flags), ctypes.byref(prog))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"seccomp filter not loaded: {os.strerror(err)}")
    return result if listener else -1


# A second, tiny filter, written here as classic BPF: it is built in the future agent after the
# baseline is loaded, which denies the memfd libseccomp's export goes through, and it names pids
# known only then.
_PRLIMIT64 = {"x86_64": 302, "aarch64": 261}.get(platform.machine(), -1)
_AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}.get(platform.machine(), -1)
_BPF_LD_ABS_W, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x15, 0x06
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
# struct seccomp_data: nr, arch, instruction pointer, then six 64-bit arguments (little-endian
# halves: the low one first).
_NR, _ARCH = 0, 4


def _arg_low(i: int) -> int:
    return 16 + 8 * i


def limits_shield(pids: list[int]) -> bytes:
    """A filter refusing (EPERM) prlimit64 with a new limit on any of `pids`: the creation guard's
    process and threads, which run with the agent's ids and so are the agent's to prlimit as far as
    the kernel is concerned (Landlock scopes signals and tracing, not resource limits). Reading
    their limits and setting any other process's stay allowed. The pid is compared on its low 32
    bits, as the kernel reads a pid_t; the new limit's pointer on all 64."""
    if _PRLIMIT64 < 0 or _AUDIT_ARCH < 0:
        raise OSError(errno.ENOSYS, f"prlimit64 unknown on {platform.machine()}")
    if not 0 < len(pids) < 200:  # a jump offset is one byte
        raise ValueError(f"{len(pids)} pids to shield")
    allow, deny = len(pids) + 9, len(pids) + 10  # the two returns, after the compares below
    program: list[tuple[int, int, int, int]] = [
        (_BPF_LD_ABS_W, 0, 0, _ARCH),
        (_BPF_JEQ_K, 0, allow - 2, _AUDIT_ARCH),  # a foreign architecture: the baseline kills it
        (_BPF_LD_ABS_W, 0, 0, _NR),
        (_BPF_JEQ_K, 0, allow - 4, _PRLIMIT64),
        (_BPF_LD_ABS_W, 0, 0, _arg_low(2)),
        (_BPF_JEQ_K, 0, 2, 0),  # a new limit: to the pid compares
        (_BPF_LD_ABS_W, 0, 0, _arg_low(2) + 4),
        (_BPF_JEQ_K, allow - 8, 0, 0),  # NULL: only reads the limits
        (_BPF_LD_ABS_W, 0, 0, _arg_low(0)),
    ]
    for pid in pids:
        program.append((_BPF_JEQ_K, deny - len(program) - 1, 0, pid & 0xFFFFFFFF))
    program += [(_BPF_RET_K, 0, 0, _RET_ALLOW), (_BPF_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)


@functools.cache
def guarded_syscall_numbers() -> dict[int, str]:
    """Syscall number -> name for the calls the creation guard answers (names and metadata)."""
    sc = pyseccomp()
    return {sc.resolve_syscall(sc.Arch.NATIVE, name): name for name in (*GUARDED, *METADATA, WATCH)}


def _build(plan: SeccompPlan) -> sc.SyscallFilter:
    """Never denies execve, close_range or anything _posixsubprocess still needs after preexec_fn."""
    sc = pyseccomp()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    for calls in DENIED_SYSCALLS.values():
        for name in calls:
            f.add_rule(eperm, name)
    for numbers in DENIED_BY_NUMBER.values():
        for number in numbers.values():
            f.add_rule(eperm, number)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # ENOSYS makes glibc fall back to clone
    for bit in _bits(CLONE_NEW_NAMESPACES):
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for name, family in DENIED_SOCKET_FAMILIES.items():
        if name == "AF_UNIX" and not plan.deny_unix_sockets:
            continue
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.MASKED_EQ, MASK32, family))
    if plan.deny_unix_sockets:
        # A datagram socketpair can still sendto() or connect() to any pathname socket; stream and
        # seqpacket pairs are connected for good and cannot address anything else.
        f.add_rule(
            sc.ERRNO(errno.EAFNOSUPPORT),
            "socketpair",
            sc.Arg(0, sc.MASKED_EQ, MASK32, socket.AF_UNIX),
            sc.Arg(1, sc.MASKED_EQ, 0xF, socket.SOCK_DGRAM),
        )
    for sock_type in (socket.SOCK_RAW, 10):  # 10: SOCK_PACKET
        f.add_rule(eperm, "socket", sc.Arg(1, sc.MASKED_EQ, 0xF, sock_type))
    f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, MASK32, TIOCSTI))
    for request in INODE_FLAG_IOCTLS.values():
        f.add_rule(sc.ERRNO(errno.EOPNOTSUPP), "ioctl", sc.Arg(1, sc.MASKED_EQ, MASK32, request))
    for number in INODE_FLAG_CALLS.values():
        f.add_rule(sc.ERRNO(errno.EOPNOTSUPP), number)
    f.add_rule(sc.ERRNO(errno.EPROTONOSUPPORT), "socket", sc.Arg(2, sc.MASKED_EQ, MASK32, IPPROTO_MPTCP))
    for name in XATTR_WRITES:
        f.add_rule(sc.ERRNO(errno.EOPNOTSUPP), name)
    for number in XATTR_WRITES_AT.values():
        f.add_rule(sc.ERRNO(errno.EOPNOTSUPP), number)
    f.add_rule(sc.NOTIFY if plan.guard_metadata else sc.ERRNO(errno.EACCES), WATCH)
    for name in METADATA:
        if not plan.guard_metadata:
            f.add_rule(eperm, name)
        elif name in CHMOD_MODE_ARG:
            # Within one filter an unconditional rule would win over conditional ones: the three
            # cases are disjoint, so a setuid or setgid bit is refused here and never reaches the guard.
            arg = CHMOD_MODE_ARG[name]
            f.add_rule(sc.NOTIFY, name, sc.Arg(arg, sc.MASKED_EQ, S_ISUID | S_ISGID, 0))
            for bit in (S_ISUID, S_ISGID):
                f.add_rule(eperm, name, sc.Arg(arg, sc.MASKED_EQ, bit, bit))
        else:
            f.add_rule(sc.NOTIFY, name)
    if plan.guard_creation:
        for name in GUARDED:
            if name in ("open", "openat"):
                flags_arg = 1 if name == "open" else 2
                f.add_rule(sc.NOTIFY, name, sc.Arg(flags_arg, sc.MASKED_EQ, os.O_CREAT, os.O_CREAT))
            else:
                f.add_rule(sc.NOTIFY, name)
        f.add_rule(sc.ERRNO(errno.ENOSYS), "openat2")
    return f


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(32) if mask & (1 << i)]
