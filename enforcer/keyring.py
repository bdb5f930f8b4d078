"""The kernel's per-user keyring (add_key, keyctl): a secret kept outside the filesystem.

Sandboxed agents cannot reach it (seccomp denies keyctl, add_key and request_key), so a key kept
here authenticates what a launcher wrote even in a directory an agent of the same uid could write.
"""

from __future__ import annotations

import ctypes
import errno
import os

_SYSCALLS = {"x86_64": (248, 250), "aarch64": (217, 219)}  # add_key, keyctl
KEY_SPEC_USER_KEYRING = -4
KEYCTL_SETPERM = 5
KEYCTL_SEARCH = 10
KEYCTL_READ = 11
# Possessor: everything; the owning uid: view, read, search. Nobody else.
_PERM = 0x3F000000 | 0x000B0000

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class KeyringUnavailable(OSError):
    pass


def _call(*args: object) -> int:
    result = int(_libc.syscall(*args))
    if result < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return result


def user_secret(description: str, size: int = 32) -> bytes:
    """The secret named `description` in the caller's user keyring, created on first use."""
    machine = os.uname().machine
    numbers = _SYSCALLS.get(machine)
    if numbers is None:
        raise KeyringUnavailable(errno.ENOSYS, f"no keyring syscall numbers for {machine}")
    add_key, keyctl = numbers
    name = description.encode()
    try:
        try:
            serial = _call(keyctl, KEYCTL_SEARCH, ctypes.c_long(KEY_SPEC_USER_KEYRING), b"user", name, 0)
        except OSError as exc:
            if exc.errno != errno.ENOKEY:
                raise
            secret = os.urandom(size)
            serial = _call(add_key, b"user", name, secret, len(secret), ctypes.c_long(KEY_SPEC_USER_KEYRING))
            _call(keyctl, KEYCTL_SETPERM, serial, _PERM)
        buffer = ctypes.create_string_buffer(size)
        length = _call(keyctl, KEYCTL_READ, serial, buffer, size)
    except OSError as exc:
        raise KeyringUnavailable(exc.errno, f"user keyring: {exc.strerror}") from exc
    if length != size:
        raise KeyringUnavailable(errno.EINVAL, f"user keyring: key {description!r} has {length} bytes")
    return buffer.raw[:size]
