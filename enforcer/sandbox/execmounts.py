"""Code is mapped only from the allowed executables and the library directories: every mount in the
agent's namespace is made `noexec`, then those paths are bound back over themselves without it.

Landlock's EXECUTE right covers execve only. The ELF loader, once executable, maps any file it can
read (`ld.so /usr/lib/git-core/git`, `ld.so ./written-by-the-agent`); a `noexec` mount refuses
mmap(PROT_EXEC) of its files, which stops the loader, LD_PRELOAD and dlopen alike.

Runs in the launch stage, inside its new mount namespace and before capabilities are dropped
(mount_setattr and mount are denied to the agent by seccomp).
"""

from __future__ import annotations

import ctypes
import os
import platform
from dataclasses import field

from ..quick_dataclass import dataclass

MOUNT_ATTR_NOEXEC = 0x00000008
AT_RECURSIVE = 0x8000
AT_FDCWD = -100
MS_BIND = 4096
MS_REC = 16384
_SYS_MOUNT_SETATTR = 442  # the same number on every architecture (added after the unified table)

_libc = ctypes.CDLL(None, use_errno=True)


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


@dataclass
class ExecMounts:
    """What stays executable, in the order it is applied."""

    files: list[str] = field(default_factory=list)  # allowed executables, the ELF interpreter
    directories: list[str] = field(default_factory=list)  # library directories: their top level only
    trees: list[str] = field(default_factory=list)  # library trees (Python C extensions): all of them
    noexec: list[str] = field(default_factory=list)  # inside the above but not code: subdirectories, grants

    def describe(self) -> list[str]:
        lines = ["every mount noexec (mmap PROT_EXEC and the ELF loader fail) except:"]
        lines += [f"  executable file: {p}" for p in self.files]
        lines += [f"  library directory (top level): {p}" for p in self.directories]
        lines += [f"  library tree: {p}" for p in self.trees]
        if self.noexec:
            shown = ", ".join(self.noexec[:3]) + (", ..." if len(self.noexec) > 3 else "")
            lines.append(f"  (noexec again beneath them: {len(self.noexec)} subdirectories or grants: {shown})")
        return lines


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _setattr(path: str, *, set_: int = 0, clear: int = 0, recursive: bool) -> None:
    attr = _MountAttr(set_, clear, 0, 0)
    flags = AT_RECURSIVE if recursive else 0
    result = _libc.syscall(
        _SYS_MOUNT_SETATTR,
        ctypes.c_int(AT_FDCWD),
        os.fsencode(path),
        ctypes.c_uint(flags),
        ctypes.byref(attr),
        ctypes.c_size_t(ctypes.sizeof(attr)),
    )
    _check(0 if result == 0 else -1, f"mount_setattr {path}")


def _bind(path: str) -> None:
    # Recursive: masks below the path (denied files) travel with the new mount.
    _check(
        _libc.mount(os.fsencode(path), os.fsencode(path), None, ctypes.c_ulong(MS_BIND | MS_REC), None), f"bind {path}"
    )


def apply(plan: ExecMounts) -> None:
    if platform.system() != "Linux":
        raise OSError("noexec mounts need Linux")
    _setattr("/", set_=MOUNT_ATTR_NOEXEC, recursive=True)
    for path in plan.files + plan.directories:
        _bind(path)
        _setattr(path, clear=MOUNT_ATTR_NOEXEC, recursive=False)
    for path in plan.trees:
        _bind(path)
        _setattr(path, clear=MOUNT_ATTR_NOEXEC, recursive=True)
    for path in plan.noexec:
        _bind(path)
        _setattr(path, set_=MOUNT_ATTR_NOEXEC, recursive=True)
