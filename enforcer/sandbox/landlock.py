"""Landlock through its three system calls (ctypes). Written here because the `landlock` PyPI package
is a pre-release with a stale-errno bug and has neither network nor scope rules.

Only `restrict()` is meant for the forked child; `abi_version()` and `LandlockPlan` are safe anywhere.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import field

from ..quick_dataclass import dataclass

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1 << 0
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38
# ABI 7: keep reporting denials to the kernel audit log after execve (the agent is always exec'd).
_RESTRICT_SELF_LOG_NEW_EXEC_ON = 1 << 1

EXECUTE = 1 << 0
WRITE_FILE = 1 << 1
READ_FILE = 1 << 2
READ_DIR = 1 << 3
REMOVE_DIR = 1 << 4
REMOVE_FILE = 1 << 5
MAKE_CHAR = 1 << 6
MAKE_DIR = 1 << 7
MAKE_REG = 1 << 8
MAKE_SOCK = 1 << 9
MAKE_FIFO = 1 << 10
MAKE_BLOCK = 1 << 11
MAKE_SYM = 1 << 12
REFER = 1 << 13  # ABI 2
TRUNCATE = 1 << 14  # ABI 3
IOCTL_DEV = 1 << 15  # ABI 5
NET_BIND_TCP = 1 << 0  # ABI 4
NET_CONNECT_TCP = 1 << 1  # ABI 4
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0  # ABI 6
SCOPE_SIGNAL = 1 << 1  # ABI 6

READ = READ_FILE | READ_DIR
WRITE = WRITE_FILE | TRUNCATE | MAKE_REG | MAKE_DIR | REMOVE_FILE | REMOVE_DIR | MAKE_SYM | REFER
# Rights that make sense on a regular file (the kernel rejects directory-only rights there).
FILE_RIGHTS = EXECUTE | WRITE_FILE | READ_FILE | TRUNCATE | IOCTL_DEV

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class LandlockError(OSError):
    pass


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def abi_version() -> int:
    """The kernel's Landlock ABI, 0 when Landlock is unavailable or disabled."""
    version = _syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(int(version), 0)


def handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= REFER
    if abi >= 3:
        rights |= TRUNCATE
    if abi >= 5:
        rights |= IOCTL_DEV
    return rights


@dataclass
class LandlockPlan:
    """Rules prepared in the parent (paths checked, rights masked to the ABI); the child only opens
    the paths and calls the kernel."""

    abi: int
    rules: list[tuple[str, int]] = field(default_factory=list)
    deny_tcp_bind: bool = True  # an agent never listens on TCP
    deny_tcp_connect: bool = True  # False only when the egress filter captures (and audits) every connect
    scope_signals: bool = True
    scope_abstract_unix: bool = True

    def add(self, path: str, rights: int) -> None:
        mask = handled_fs(self.abi)
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        self.rules.append((path, rights & mask))

    def ruleset_attr(self) -> tuple[_RulesetAttr, int]:
        attr = _RulesetAttr(handled_fs(self.abi), 0, 0)
        size = 8
        if self.abi >= 4:
            size = 16
            attr.handled_access_net = (NET_BIND_TCP if self.deny_tcp_bind else 0) | (
                NET_CONNECT_TCP if self.deny_tcp_connect else 0
            )
        if self.abi >= 6:
            size = 24
            attr.scoped = (SCOPE_SIGNAL if self.scope_signals else 0) | (
                SCOPE_ABSTRACT_UNIX_SOCKET if self.scope_abstract_unix else 0
            )
        return attr, size


def _fail(what: str) -> LandlockError:
    err = ctypes.get_errno()
    return LandlockError(err, f"landlock {what}: {os.strerror(err)}")


def _open_as_agent(path: str) -> int:
    """Rules are added once the process is the agent's identity, so a rule names only what that
    identity can reach by its path: a grant it cannot reach is an operator's mistake, refused."""
    try:
        return os.open(path, os.O_PATH | os.O_CLOEXEC)
    except PermissionError as exc:
        raise LandlockError(
            exc.errno,
            f"the policy grants {path}, which the agent's identity (uid {os.geteuid()}) cannot reach "
            f"({exc.strerror}): grant a path it can reach, or run the agent as an identity that can",
        ) from None
    except OSError as exc:
        raise LandlockError(exc.errno, f"the policy grants {path}, which cannot be opened: {exc.strerror}") from None


def restrict(plan: LandlockPlan) -> None:
    """Build the ruleset and restrict the calling thread (and its future children). Sets
    no_new_privs, which Landlock requires without CAP_SYS_ADMIN and the sandbox wants anyway."""
    attr, size = plan.ruleset_attr()
    ruleset = _syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if ruleset < 0:
        raise _fail("create_ruleset")
    try:
        for path, rights in plan.rules:
            if not rights:
                continue
            fd = _open_as_agent(path)
            try:
                rule = _PathBeneathAttr(rights, fd)
                if (
                    _syscall(
                        _SYS_ADD_RULE,
                        ctypes.c_int(ruleset),
                        ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule),
                        ctypes.c_uint32(0),
                    )
                    < 0
                ):
                    raise _fail(f"add_rule {path}")
            finally:
                os.close(fd)
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _fail("no_new_privs")
        flags = _RESTRICT_SELF_LOG_NEW_EXEC_ON if plan.abi >= 7 else 0
        if _syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(flags)) < 0:
            raise _fail("restrict_self")
    finally:
        os.close(ruleset)
