"""Default locations for state the enforcer writes: system paths for root, XDG paths otherwise; and
the check that a directory the enforcer writes or trusts is writable only by root or its user.

The location functions are given the environment to read XDG_* from (the command's; nothing here reads
os.environ). The ADL_ENFORCER_* settings that move these locations are in enforcer/settings.py."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path


def state_dir(environ: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/adl-enforcer")
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "adl-enforcer"


def audit_dir(environ: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/log/adl-enforcer")
    return state_dir(environ) / "audit"


def audit_key_path(environ: Mapping[str, str]) -> Path:
    """The checkpoint signing key lives apart from the log so that write access to the log alone
    cannot re-seal an edited log."""
    return state_dir(environ) / "audit-signing-key.pem"


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where compiled policies are cached: root's cache is in /var/cache, a user's in their XDG
    cache directory."""
    if os.geteuid() == 0:
        return Path("/var/cache/adl-enforcer/policies")
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "adl-enforcer" / "policies"


def runtime_dir(environ: Mapping[str, str]) -> Path:
    """Where adl-enforcerd's sockets and lock files are by default."""
    return Path("/run/adl-enforcer") if os.geteuid() == 0 else state_dir(environ) / "run"


def check_private(directory: Path) -> Path:
    """The path `directory` resolves to. PermissionError naming the path and what is wrong unless
    this process's user owns `directory`, nobody else may write it, and every directory above it is
    writable only by root or this user (a root-owned sticky directory such as /tmp may be above
    it). Whoever else could write
    there could plant or replace the names the enforcer, often root, reads and writes through: a
    symlink where a log file goes, an agent's policy rewritten."""
    real = _resolve(directory)
    _check_owners(real, private_leaf=True)
    return real


def make_private_dir(directory: Path, mode: int) -> Path:
    """Create `directory` (and what is missing above it, with `mode`) only once the nearest existing
    directory above it passes the checks for a directory above, then check it as check_private
    does (returning what it returns): a refusal leaves nothing behind."""
    named = Path(os.path.abspath(directory))
    existing = named
    missing: list[Path] = []
    while not os.path.lexists(existing) and existing != existing.parent:
        missing.append(existing)
        existing = existing.parent
    _check_owners(_resolve(existing), private_leaf=not missing)
    # One by one with `mode`: os.makedirs gives the directories above the last the default mode,
    # group-writable under umask 002, which the check below would then refuse.
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another writer: checked below
            os.mkdir(path, mode)
    return check_private(named)


def check_private_file(path: Path) -> None:
    """PermissionError unless the file `path` resolves to is a regular file owned by root or this
    process's user that nobody else may write, in a directory check_private accepts, reached only
    through links check_private accepts."""
    real = _resolve(path)
    _check_owners(real.parent, private_leaf=True)
    _check_unwritable(real, os.stat(real), stat.S_ISREG, "a regular file")


def check_import_directory(directory: Path) -> None:
    """PermissionError unless `directory` (a PYTHONPATH entry) resolves to a directory owned by root
    or this process's user that nobody else may write (not even a sticky one), below directories
    check_private accepts above a directory: another user could plant modules there."""
    real = _resolve(directory)
    _check_owners(real.parent, private_leaf=False)
    _check_unwritable(real, os.lstat(real), stat.S_ISDIR, "a directory")


def _check_unwritable(real: Path, st: os.stat_result, is_kind: Callable[[int], bool], kind: str) -> None:
    """PermissionError unless `real` is of its kind, owned by root or this process's user, and
    writable by nobody else."""
    if not is_kind(st.st_mode):
        raise PermissionError(f"{real} is not {kind}")
    if st.st_uid not in (0, os.geteuid()):
        raise PermissionError(f"{real} is owned by uid {st.st_uid}")
    if st.st_mode & 0o022:
        raise PermissionError(f"{real} is writable by group or others")


def _resolve(directory: Path) -> Path:
    """The path `directory` resolves to, walked as the kernel resolves it (the named path, then each
    link's target, '..' after a link included), once every symlink met on the way belongs to root
    or this user and every directory such a link lies in passes the check for a directory above:
    another user's link could point anywhere, and a link in a directory others may write can be
    swapped for theirs at any time. (realpath would read a link without these checks:
    protected_symlinks does not apply to it.)"""
    euid = os.geteuid()
    named = Path(directory)
    # Not abspath: it drops "link/.." unresolved. Not cwd() for an absolute path: cwd may be gone.
    left = list((named if named.is_absolute() else Path.cwd() / named).parts[1:])
    current = Path("/")
    links = 0
    while left:
        part = left.pop(0)
        if part == "..":
            current = current.parent
            continue
        candidate = current / part
        st = os.lstat(candidate)
        if not stat.S_ISLNK(st.st_mode):
            current = candidate
            continue
        if st.st_uid not in (0, euid):
            raise PermissionError(f"{candidate} is a symlink of uid {st.st_uid}")
        _check_owners(current, private_leaf=False)
        links += 1
        if links > 40:  # the kernel's limit too
            raise OSError(errno.ELOOP, f"{directory}: too many levels of symbolic links")
        target = Path(os.readlink(candidate))
        if target.is_absolute():
            current = Path("/")
        left[:0] = [p for p in target.parts if p != "/"]
    return current


def _check_owners(real: Path, *, private_leaf: bool) -> None:
    euid = os.geteuid()
    parts = real.parts
    for depth in range(1, len(parts) + 1):
        current = Path(*parts[:depth])
        st = os.lstat(current)
        leaf = private_leaf and depth == len(parts)
        if not stat.S_ISDIR(st.st_mode):
            raise PermissionError(f"{current} is not a directory")
        if st.st_uid not in (0, euid) or (leaf and st.st_uid != euid):
            raise PermissionError(f"{current} is owned by uid {st.st_uid}")
        if st.st_mode & 0o022 and (leaf or not (st.st_mode & stat.S_ISVTX and st.st_uid == 0)):
            raise PermissionError(f"{current} is writable by group or others")


def replace_file(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """`data` as file `name` in the directory `dir_fd`, replacing what the name holds at once: it is
    written to a new file under a random name (O_EXCL, O_NOFOLLOW) and renamed over `name`, so a
    symlink or hard link someone left at `name` is replaced, never written through, and a reader
    never sees a partial file."""
    temporary = f".{name}.{os.urandom(6).hex()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        with open(os.open(temporary, flags, mode, dir_fd=dir_fd), "wb") as out:
            out.write(data)
        os.replace(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary, dir_fd=dir_fd)
        raise
