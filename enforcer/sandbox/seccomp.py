"""The seccomp baseline every sandbox gets (DESIGN.md section 4), built with pyseccomp.

Default allow with a deny list: the agent runs arbitrary programs, so an allow list would break
them; what is denied is the kernel surface sandbox escapes go through. Denied calls fail with
EPERM and the kernel logs them (SECCOMP_RET_LOG is not combinable with ERRNO, so the launcher
reports violations it can observe instead). Argument compares use a 32-bit mask so garbage in the
upper half of a register cannot slip past; a foreign architecture kills the process.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

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


@dataclass(frozen=True)
class SeccompPlan:
    deny_unix_sockets: bool = True


def describe(plan: SeccompPlan) -> list[str]:
    lines = [f"{why}: {', '.join(calls)}" for why, calls in DENIED_SYSCALLS.items()]
    families = [f for f in DENIED_SOCKET_FAMILIES if plan.deny_unix_sockets or f != "AF_UNIX"]
    lines.append(f"sockets: {', '.join(families)}, SOCK_RAW of any family; socketpair(AF_UNIX) stays allowed")
    lines.append("clone with namespace flags; clone3 (flags not inspectable); ioctl TIOCSTI")
    lines.append("foreign architecture (32-bit syscall ABI): process killed")
    return lines


def apply(plan: SeccompPlan) -> None:
    """Load the filter in the calling (single-threaded, forked) process. Never denies execve,
    close_range or anything _posixsubprocess still needs after preexec_fn."""
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)
    eperm = sc.ERRNO(errno.EPERM)
    for calls in DENIED_SYSCALLS.values():
        for name in calls:
            f.add_rule(eperm, name)
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")  # ENOSYS makes glibc fall back to clone
    for bit in _bits(CLONE_NEW_NAMESPACES):
        f.add_rule(eperm, "clone", sc.Arg(0, sc.MASKED_EQ, bit, bit))
    for name, family in DENIED_SOCKET_FAMILIES.items():
        if name == "AF_UNIX" and not plan.deny_unix_sockets:
            continue
        f.add_rule(sc.ERRNO(errno.EAFNOSUPPORT), "socket", sc.Arg(0, sc.MASKED_EQ, MASK32, family))
    for sock_type in (socket.SOCK_RAW, 10):  # 10: SOCK_PACKET
        f.add_rule(eperm, "socket", sc.Arg(1, sc.MASKED_EQ, 0xF, sock_type))
    f.add_rule(eperm, "ioctl", sc.Arg(1, sc.MASKED_EQ, MASK32, TIOCSTI))
    f.load()


def _bits(mask: int) -> list[int]:
    return [1 << i for i in range(32) if mask & (1 << i)]
