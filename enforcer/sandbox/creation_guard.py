"""Denied paths created after launch: a seccomp user-notification supervisor.

Masks cover files that exist at launch; Landlock cannot match names, so a writable allowed tree would
let the agent create `.env` or `id_rsa` there and read it back. Every syscall that creates a name
(open/openat/creat with O_CREAT, mkdir, mknod, link, symlink, rename) is sent to this supervisor
instead of running. The supervisor reads the path from the caller's memory once, opens the parent
directory, takes that directory's real path from the kernel, refuses names that match a denied
pattern, and otherwise performs the operation itself and hands back the result (a new file
descriptor is installed in the caller with SECCOMP_IOCTL_NOTIF_ADDFD). Nothing is ever sent back
with SECCOMP_USER_NOTIF_FLAG_CONTINUE, so a thread rewriting the path after the check changes
nothing: the checked string is the one used.

The supervisor runs with the agent's uid, groups and mount namespace, inside a Landlock domain that
is the agent's plus read access to /proc (to read callers' memory and descriptors); the agent's own
domain is nested inside it, so the agent can neither signal nor trace the supervisor, while the
supervisor can read the agent; nor lower its resource limits, which the kernel allows a process of
the same ids and Landlock does not scope: the agent's filter refuses prlimit on the supervisor's
process and threads (seccomp.limits_shield). It is not dumpable and its environment is emptied. If
it dies, every guarded call fails (ENOSYS): creation stops, it is never let through unchecked.

The supervisor never resolves a path the agent names with more rights than the agent: once started,
its main thread restricts itself to exactly the agent's Landlock rules and performs every lookup,
open, creation, rename and metadata change there. A helper thread keeps the wider domain and only
opens fixed /proc entries of the calling thread (its memory and status, once per thread; its cwd and
the descriptors it names as O_PATH handles). Reopening /proc/self/fd/N therefore grants what the
agent could open itself, nothing more (a confused deputy would read host /proc files for it). Names
created under /proc are refused outright.

A rename or exchange creates every name inside a moved directory: each one is checked against the
denied patterns (a tree too large or unreadable to check is refused with EXDEV, so `mv` falls back
to copying name by name, each checked).

Refusals are reported as JSON lines on a pipe the launcher reads after the session.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import errno
import fcntl
import os
import queue
import re
import select
import stat
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson

from ..policy.patterns import PatternList
from ..quick_dataclass import dataclass
from ..text import escape_non_utf8
from .seccomp import GUARDED, METADATA, WATCH

if TYPE_CHECKING:
    from .landlock import LandlockPlan

IN_ONLYDIR, IN_DONT_FOLLOW = 0x01000000, 0x02000000
_SYS_PIDFD_OPEN, _SYS_PIDFD_GETFD = 434, 438
# Argument positions of what each metadata call sets.
_MODE_ARG = {"chmod": 1, "fchmod": 1, "fchmodat": 2, "fchmodat2": 2}
_OWNER_ARGS = {"chown": 1, "lchown": 1, "fchown": 1, "fchownat": 2}
_TIMES = {"utime": (1, 16), "utimes": (1, 32), "futimesat": (2, 32), "utimensat": (2, 32)}  # (argument, bytes)
AT_SYMLINK_NOFOLLOW = 0x100

# <linux/seccomp.h>
NOTIF_RECV = 0xC0502100
NOTIF_SEND = 0xC0182101
NOTIF_ID_VALID = 0x40082102
NOTIF_ADDFD = 0x40182103
ADDFD_FLAG_SEND = 2
_NOTIF = struct.Struct("=QIIiIQ6Q")  # id, pid, flags, nr, arch, instruction pointer, args[6]
_RESP = struct.Struct("=QqiI")  # id, val, error, flags
_ADDFD = struct.Struct("=QIIII")  # id, flags, srcfd, newfd, newfd_flags

AT_FDCWD = -100
AT_SYMLINK_FOLLOW = 0x400
AT_EMPTY_PATH = 0x1000
RENAME_EXCHANGE = 2
PATH_MAX = 4096
MAX_SYMLINKS = 40
MAX_REPORTED = 200  # refusals reported one by one; later ones are only counted
MAX_KEPT_MEM = 256
MAX_MOVED_TREE = 10_000  # names checked in a moved directory; beyond, EXDEV (mv then copies)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
_libc.utimensat.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int)
_libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)


class Refused(Exception):
    """The call is answered with an errno and nothing is done."""

    def __init__(self, err: int, reason: str = "", path: str = "", pattern: str = "") -> None:
        super().__init__(reason)
        self.err, self.path, self.pattern = err, path, pattern


@dataclass
class Caller:
    tid: int
    tgid: int
    umask: int


def _int32(value: int) -> int:
    return ctypes.c_int32(value & 0xFFFFFFFF).value


@dataclass(frozen=True)
class DeniedNames:
    """`denied(path)`: the denied pattern a new name matches, or None. A plain object rather than a
    closure so the launch stage can receive it pickled."""

    patterns: PatternList
    write_roots: tuple[str, ...] = ()  # real paths of the writable grants: metadata changes stay inside

    def __call__(self, path: str) -> str | None:
        hit = self.patterns.first(path)
        return None if hit is None else self.patterns.patterns[hit]

    def writable(self, path: str) -> bool:
        return any(path == root or path.startswith(root.rstrip("/") + "/") for root in self.write_roots)

    def may_match_beneath(self, path: str) -> bool:
        """Whether some denied pattern could match a name strictly beneath `path`: only then does a
        moved directory's content need to be listed."""
        return _trie_continues(self.patterns._index, path)

    def alias_pattern(self, path: str) -> str | None:
        """The denied pattern a symbolic link at `path` would open a second way into: one whose own
        segment (not a '**') names the link and that continues below it. `.aws -> elsewhere` makes
        `.aws/credentials` resolve while each name is created under `elsewhere`, unchecked."""
        for pattern in self.patterns.patterns:
            if _trie_continues(PatternList.compile([pattern], "path")._index, path, named=True):
                return pattern
        return None


def _trie_continues(index: object, path: str, *, named: bool = False) -> bool:
    """Whether some pattern can still consume segments below `path` (SegmentTrie.continues)."""
    continues = getattr(index, "continues", None)
    if continues is None:
        return True  # not a path trie: assume the worst
    return bool(continues(path, named=named))


class WideRights:
    """A thread that keeps the supervisor's wider Landlock domain (read access to /proc) after the
    main thread has restricted itself to the agent's rules: Landlock domains belong to threads. It
    runs only the fixed /proc opens the main thread hands it."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...]]] = queue.SimpleQueue()
        self._answers: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        # A bare thread: a threading.Thread would be the first in this fork, and its bookkeeping
        # (the module's registries, events, locks) copies pages the guard shares with the
        # processes it was forked from, held for the whole session.
        _thread.start_new_thread(self._serve, ())

    def _serve(self) -> None:
        while True:
            fn, args = self._requests.get()
            try:
                self._answers.put((True, fn(*args)))
            except BaseException as exc:
                self._answers.put((False, exc))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        self._requests.put((fn, args))
        ok, value = self._answers.get()
        if not ok:
            raise value
        return value

    def open(self, path: str, flags: int) -> int:
        return int(self.call(os.open, path, flags | os.O_CLOEXEC))


class Supervisor:
    def __init__(
        self,
        listener: int,
        denied: Callable[[str], str | None],
        syscall_names: dict[int, str],
        report_fd: int = -1,
        agent_rules: LandlockPlan | None = None,
    ) -> None:
        """`denied(path)` returns the denied pattern a path matches, or None. `agent_rules`: the
        agent's Landlock rules, applied to the thread that performs every call."""
        self.listener = listener
        self.denied = denied
        self.names = syscall_names
        self.report_fd = report_fd
        self.refusals = 0
        self.handled = 0
        self._mem: dict[int, int] = {}  # tid -> its /proc/<tid>/mem
        self._status: dict[int, int] = {}  # tid -> its /proc/<tid>/status
        self.wide = WideRights()
        if agent_rules is not None and agent_rules.abi:
            from .landlock import restrict

            restrict(agent_rules)  # this thread only: the helper keeps the wider domain

    # -- loop -------------------------------------------------------------------------------------

    def serve(self) -> None:
        """Answer notifications until no sandboxed process is left (the listener hangs up)."""
        poller = select.poll()
        poller.register(self.listener, select.POLLIN)
        while True:
            events = poller.poll()
            if any(ev & (select.POLLHUP | select.POLLERR) for _, ev in events):
                break
            buf = bytearray(_NOTIF.size)
            try:
                fcntl.ioctl(self.listener, NOTIF_RECV, buf)
            except OSError as exc:
                if exc.errno in (errno.EINTR, errno.ENOENT):  # the caller died or was interrupted
                    continue
                raise
            self.handle(buf)
        self._report({"summary": True, "handled": self.handled, "refused": self.refusals})

    def handle(self, buf: bytearray) -> None:
        notif_id, tid, _flags, nr, _arch, _ip, *args = _NOTIF.unpack(buf)
        name = self.names.get(nr, str(nr))
        self.handled += 1
        opened: list[int] = []
        try:
            caller = self._caller(tid)
            result = self._dispatch(notif_id, name, caller, args, opened)
        except Refused as refusal:
            if refusal.pattern:
                self.refusals += 1
                if self.refusals <= MAX_REPORTED:
                    self._report(
                        {
                            "syscall": name,
                            "path": refusal.path,
                            "pattern": refusal.pattern,
                            "pid": tid,
                            "ts": time.time_ns(),
                        }
                    )
            result = -refusal.err
        except OSError as exc:
            result = -(exc.errno or errno.EIO)
        except Exception:  # a bug here must deny the call, not kill the guard (which stops all creation)
            result = -errno.EPERM
        finally:
            for fd in opened:
                os.close(fd)
        if isinstance(result, tuple):  # ("fd", fd, cloexec): install it in the caller
            _, fd, cloexec = result
            try:
                fcntl.ioctl(self.listener, NOTIF_ADDFD, _ADDFD.pack(notif_id, ADDFD_FLAG_SEND, fd, 0, cloexec))
            except OSError:
                pass  # the caller died meanwhile
            finally:
                os.close(fd)
            return
        value, error = (result, 0) if result >= 0 else (0, result)
        with contextlib.suppress(OSError):
            fcntl.ioctl(self.listener, NOTIF_SEND, _RESP.pack(notif_id, value, error, 0))

    def _report(self, event: dict[str, Any]) -> None:
        if self.report_fd < 0:
            return
        # A name that is not UTF-8 (fsdecode keeps its bytes as surrogates, which the encoder
        # refuses) is reported with those bytes as \xNN: the agent chose it, and an encoder error
        # here would end the guard and leave the refusal unrecorded.
        event = {k: escape_non_utf8(v) if isinstance(v, str) else v for k, v in event.items()}
        # A full or closed pipe must not stop the guard; the count still reaches the summary.
        with contextlib.suppress(OSError):
            os.write(self.report_fd, orjson.dumps(event) + b"\n")

    # -- one call: gathered with the supervisor's rights, performed with the agent's --------------

    def _dispatch(self, notif_id: int, name: str, caller: Caller, args: list[int], opened: list[int]) -> Any:
        if name in METADATA:
            return self._dispatch_metadata(notif_id, name, caller, args, opened)
        if name == WATCH:
            return self._dispatch_watch(notif_id, caller, args, opened)
        pairs = GUARDED.get(name)
        if pairs is None:
            raise Refused(errno.ENOSYS)
        paths = [self._read_string(caller.tid, args[p]) for _, p in pairs]
        bases: list[int] = []
        for i, ((d, _), path) in enumerate(zip(pairs, paths, strict=True)):
            base, rest = self._own_descriptor(caller, path, opened)
            if base is not None:
                bases.append(base)
                paths[i] = rest
            elif path.startswith("/"):
                bases.append(AT_FDCWD)
            else:
                bases.append(self._base(caller, None if d is None else _int32(args[d]), opened))
        link_source = None
        if name == "linkat" and _int32(args[4]) & AT_EMPTY_PATH and not paths[0]:
            link_source = self._base(caller, _int32(args[0]), opened)
        symlink_target = self._read_string(caller.tid, args[0]) if name in ("symlink", "symlinkat") else ""
        # The caller must still be waiting in this call: its pid (and so its /proc entries) are its own.
        fcntl.ioctl(self.listener, NOTIF_ID_VALID, struct.pack("=Q", notif_id))
        os.umask(caller.umask)
        return self._perform(name, caller, args, pairs, paths, bases, link_source, symlink_target)

    def _dispatch_metadata(self, notif_id: int, name: str, caller: Caller, args: list[int], opened: list[int]) -> Any:
        dirfd_arg, path_arg, flags_arg = METADATA[name]
        flags = _int32(args[flags_arg]) if flags_arg is not None else 0
        path = self._read_string(caller.tid, args[path_arg]) if path_arg is not None and args[path_arg] else ""
        if path_arg is not None and not path and not (flags & AT_EMPTY_PATH or name == "utimensat"):
            raise Refused(errno.ENOENT)
        base, rest = self._own_descriptor(caller, path, opened) if path else (None, path)
        if base is None:
            if path.startswith("/"):
                base = AT_FDCWD
            elif not path:  # the descriptor itself
                base = self._base(caller, _int32(args[dirfd_arg if dirfd_arg is not None else 0]), opened)
            else:
                base = self._base(caller, None if dirfd_arg is None else _int32(args[dirfd_arg]), opened)
        else:
            path = rest
        times = None
        if name in _TIMES and args[_TIMES[name][0]]:
            times = self._read_bytes(caller.tid, args[_TIMES[name][0]], _TIMES[name][1])
        nofollow = name == "lchown" or bool(flags & AT_SYMLINK_NOFOLLOW)
        fcntl.ioctl(self.listener, NOTIF_ID_VALID, struct.pack("=Q", notif_id))
        return self._set_metadata(name, base, path, nofollow, args, times)

    def _set_metadata(
        self, name: str, base: int, path: str, nofollow: bool, args: list[int], times: bytes | None
    ) -> int:
        """With the agent's rights: resolve the file as the agent would, then change it only
        when it lies beneath a writable grant."""
        target = base
        if path:
            target = os.open(path, os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if nofollow else 0), dir_fd=base)
        try:
            where = _real(target)
            writable = getattr(self.denied, "writable", None)
            if _on_procfs(target) or writable is None or not writable(where):
                raise Refused(errno.EPERM)
            magic = f"/proc/thread-self/fd/{target}"  # the checked file itself, whatever its name is now
            if name in _MODE_ARG:
                os.chmod(magic, _safe_mode(args[_MODE_ARG[name]]))
            elif name in _OWNER_ARGS:
                uid, gid = (_int32(args[_OWNER_ARGS[name] + i]) for i in (0, 1))
                os.chown(magic, uid, gid)
            else:
                _set_times(magic, name, times)
            return 0
        finally:
            if target != base:
                os.close(target)

    def _dispatch_watch(self, notif_id: int, caller: Caller, args: list[int], opened: list[int]) -> Any:
        path = self._read_string(caller.tid, args[1])
        base, rest = self._own_descriptor(caller, path, opened)
        if base is None:
            base = AT_FDCWD if path.startswith("/") else self._base(caller, None, opened)
        else:
            path = rest
        # The caller's inotify instance itself (not a copy): the watch must land in it.
        pidfd = self.wide.call(_syscall_fd, _SYS_PIDFD_OPEN, caller.tgid, 0)
        opened.append(pidfd)
        instance = self.wide.call(_syscall_fd, _SYS_PIDFD_GETFD, pidfd, _int32(args[0]), 0)
        opened.append(instance)
        fcntl.ioctl(self.listener, NOTIF_ID_VALID, struct.pack("=Q", notif_id))
        return self._watch(instance, base, path, args[2] & 0xFFFFFFFF)

    def _watch(self, instance: int, base: int, path: str, mask: int) -> int:
        """With the agent's rights: watch only what the agent could open for reading."""
        flags = os.O_PATH | os.O_CLOEXEC | (os.O_NOFOLLOW if mask & IN_DONT_FOLLOW else 0)
        target = os.open(path, flags | (os.O_DIRECTORY if mask & IN_ONLYDIR else 0), dir_fd=base) if path else base
        try:
            magic = f"/proc/thread-self/fd/{target}"
            kind = os.fstat(target).st_mode
            if _on_procfs(target) or not (stat.S_ISDIR(kind) or stat.S_ISREG(kind)):
                raise Refused(errno.EACCES)
            probe = os.open(magic, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # Landlock's read check
            os.close(probe)
            wd = _libc.inotify_add_watch(instance, os.fsencode(magic), mask & ~IN_DONT_FOLLOW)
            if wd < 0:
                return -ctypes.get_errno()
            return int(wd)
        finally:
            if target != base:
                os.close(target)

    def _read_bytes(self, tid: int, address: int, size: int) -> bytes:
        def exact(fd: int) -> bytes:
            data = os.pread(fd, size, address)
            if len(data) != size:
                raise OSError(errno.EFAULT, "memory not readable")
            return data

        return bytes(self._from_memory(tid, exact))

    def _caller(self, tid: int) -> Caller:
        """The calling thread's status, read through a descriptor kept per thread (a kept
        descriptor of a thread that is gone reads nothing and is opened afresh)."""
        for _ in range(2):
            fd = self._status.pop(tid, None)
            if fd is None:
                if len(self._status) >= MAX_KEPT_MEM:
                    for kept in self._status.values():
                        os.close(kept)
                    self._status.clear()
                fd = self.wide.open(f"/proc/{tid}/status", os.O_RDONLY)
            try:
                status = os.pread(fd, 8192, 0)
            except OSError:
                status = b""
            if status:
                self._status[tid] = fd
                return _parse_status(tid, status)
            os.close(fd)
        raise Refused(errno.ESRCH)

    def _own_descriptor(self, caller: Caller, path: str, opened: list[int]) -> tuple[int | None, str]:
        """/proc/self/fd/N[/rest] (and /dev/stdout and friends) name one of the caller's descriptors:
        taken here as an O_PATH handle, so the agent thread resolves the rest from it."""
        match = re.fullmatch(rf"/proc/{caller.tgid}(?:/task/{caller.tid})?/fd/(\d+)(/.*)?", _proc_view(path, caller))
        if not match:
            return None, path
        fd = self.wide.open(f"/proc/{caller.tid}/fd/{match.group(1)}", os.O_PATH)
        opened.append(fd)
        return fd, (match.group(2) or "").lstrip("/")

    def _perform(
        self,
        name: str,
        caller: Caller,
        args: list[int],
        pairs: tuple[tuple[int | None, int], ...],
        paths: list[str],
        bases: list[int],
        link_source: int | None,
        symlink_target: str,
    ) -> Any:
        """With the agent's rights (the main thread is restricted to them)."""
        opened: list[int] = []
        try:
            return self._perform_call(name, caller, args, pairs, paths, bases, link_source, symlink_target, opened)
        finally:
            for fd in opened:
                os.close(fd)

    def _perform_call(
        self,
        name: str,
        caller: Caller,
        args: list[int],
        pairs: tuple[tuple[int | None, int], ...],
        paths: list[str],
        bases: list[int],
        link_source: int | None,
        symlink_target: str,
        opened: list[int],
    ) -> Any:
        if name in ("open", "openat", "creat"):
            flags = os.O_CREAT | os.O_WRONLY | os.O_TRUNC if name == "creat" else _int32(args[pairs[0][1] + 1])
            mode = args[1] if name == "creat" else args[pairs[0][1] + 2]
            return self._open(caller, bases[0], paths[0], flags, _safe_mode(mode), opened)
        if name in ("mkdir", "mkdirat"):
            parent, leaf = self._creation_target(caller, bases[0], paths[0], opened, name)
            os.mkdir(leaf, args[pairs[0][1] + 1] & 0o7777, dir_fd=parent)
            return 0
        if name in ("mknod", "mknodat"):
            parent, leaf = self._creation_target(caller, bases[0], paths[0], opened, name)
            mode = args[pairs[0][1] + 1] & 0xFFFFFFFF
            os.mknod(leaf, (mode & ~0o7777) | _safe_mode(mode), args[pairs[0][1] + 2], dir_fd=parent)
            return 0
        if name in ("symlink", "symlinkat"):
            parent, leaf = self._creation_target(caller, bases[0], paths[0], opened, name)
            self._check_alias(_real(parent) + "/" + leaf, name)
            os.symlink(symlink_target, leaf, dir_fd=parent)
            return 0
        parent, leaf = self._creation_target(caller, bases[1], paths[1], opened, name)
        if name.startswith("link"):
            flags = _int32(args[4]) if name == "linkat" else 0
            if link_source is not None:  # AT_EMPTY_PATH: the descriptor itself gets the name
                os.link(f"/proc/thread-self/fd/{link_source}", leaf, dst_dir_fd=parent, follow_symlinks=True)
                return 0
            old_base, old_path = bases[0], _proc_view(paths[0], caller)
            follow = bool(flags & AT_SYMLINK_FOLLOW)
            with contextlib.suppress(OSError):  # a hard link to a symbolic link is one more link
                if not follow and stat.S_ISLNK(
                    os.stat(old_path, dir_fd=None if old_base < 0 else old_base, follow_symlinks=False).st_mode
                ):
                    self._check_alias(_real(parent) + "/" + leaf, name)
            os.link(
                old_path,
                leaf,
                src_dir_fd=None if old_base < 0 else old_base,
                dst_dir_fd=parent,
                follow_symlinks=follow,
            )
            return 0
        flags = _int32(args[4]) if name == "renameat2" else 0
        old_parent, old_leaf = self._creation_target(
            caller, bases[0], paths[0], opened, name, check=bool(flags & RENAME_EXCHANGE)
        )
        new_full = _real(parent) + "/" + leaf
        # Whatever moves to the new name brings its contents; with an exchange, both sides do.
        self._check_moved_tree(old_parent, old_leaf, new_full, name)
        if flags & RENAME_EXCHANGE:
            self._check_moved_tree(parent, leaf, _real(old_parent) + "/" + old_leaf, name)
        if _libc.renameat2(old_parent, os.fsencode(old_leaf), parent, os.fsencode(leaf), flags) != 0:
            return -ctypes.get_errno()
        return 0

    def _check_alias(self, full: str, syscall: str) -> None:
        alias = getattr(self.denied, "alias_pattern", None)
        pattern = alias(full) if alias is not None else None
        if pattern is not None:
            raise Refused(errno.EACCES, f"{syscall} would make a symbolic link into a denied path", full, pattern)

    def _check_moved_tree(self, parent: int, leaf: str, destination: str, syscall: str) -> None:
        """Refuse when a directory arriving at `destination` holds a name a denied pattern matches
        there. The supervisor answers one call at a time, so no name can be added in between."""
        try:
            info = os.stat(leaf, dir_fd=parent, follow_symlinks=False)
        except OSError:
            return  # the rename itself reports it
        if stat.S_ISLNK(info.st_mode):
            self._check_alias(destination, syscall)
            return
        if not stat.S_ISDIR(info.st_mode):
            return
        may = getattr(self.denied, "may_match_beneath", None)
        if may is not None and not may(destination):
            return
        try:
            top = os.open(leaf, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError:
            raise Refused(errno.EXDEV) from None
        seen = 0
        try:
            for root, dirs, files, _ in os.fwalk(".", dir_fd=top, follow_symlinks=False, onerror=_raise):
                for entry in dirs + files:
                    seen += 1
                    if seen > MAX_MOVED_TREE:
                        raise Refused(errno.EXDEV)
                    full = os.path.normpath(f"{destination}/{root}/{entry}")
                    pattern = self.denied(full)
                    if pattern is not None:
                        raise Refused(errno.EACCES, f"{syscall} would create a denied path", full, pattern)
        except OSError:
            raise Refused(errno.EXDEV) from None
        finally:
            os.close(top)

    def _read_string(self, tid: int, address: int) -> str:
        """A NUL-terminated path from the caller's memory, read once, page by page (a read must not
        cross into an unmapped page).

        /proc/<tid>/mem descriptors are kept per thread, which saves an open and its permission
        check on every call. A kept descriptor is bound to the memory it was opened on: after an
        exec, or once the thread is gone and its id reused, it reads nothing and is opened afresh,
        so it never yields another program's memory."""
        if address == 0:
            raise Refused(errno.EFAULT)
        return self._from_memory(tid, lambda fd: _read_c_string(fd, address))

    def _from_memory(self, tid: int, read: Callable[[int], Any]) -> Any:
        kept = self._mem.pop(tid, None)
        if kept is not None:
            try:
                value = read(kept)
                self._mem[tid] = kept
                return value
            except OSError:
                os.close(kept)  # stale; try a fresh one
        if len(self._mem) >= MAX_KEPT_MEM:
            self._drop_mem()
        try:
            fd = self.wide.open(f"/proc/{tid}/mem", os.O_RDONLY)
        except OSError:
            raise Refused(errno.EFAULT) from None
        try:
            value = read(fd)
        except OSError as exc:
            os.close(fd)
            raise Refused(exc.errno if exc.errno == errno.ENAMETOOLONG else errno.EFAULT) from None
        self._mem[tid] = fd
        return value

    def _drop_mem(self) -> None:
        for fd in self._mem.values():
            os.close(fd)
        self._mem.clear()

    def _base(self, caller: Caller, dirfd: int | None, opened: list[int]) -> int:
        """A descriptor for the directory a relative path starts from, as the caller sees it."""
        where = f"/proc/{caller.tid}/cwd" if dirfd is None or dirfd == AT_FDCWD else f"/proc/{caller.tid}/fd/{dirfd}"
        fd = self.wide.open(where, os.O_PATH)
        opened.append(fd)
        return fd

    def _creation_target(
        self, caller: Caller, base: int, path: str, opened: list[int], syscall: str, *, check: bool = True
    ) -> tuple[int, str]:
        """(parent directory descriptor, leaf name) for a name about to be created, after checking the
        real path of the opened parent against the denied patterns (`check`)."""
        path = _proc_view(path, caller)
        head, leaf = os.path.split(path.rstrip("/") or path)
        if leaf in ("", ".", ".."):
            raise Refused(errno.EEXIST)
        parent = os.open(head or ".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=base)
        opened.append(parent)
        real_parent = _real(parent)
        if real_parent == "/proc" or real_parent.startswith("/proc/") or _on_procfs(parent):
            raise Refused(errno.EACCES)
        full = real_parent.rstrip("/") + "/" + leaf
        pattern = self.denied(full) if check else None
        if pattern is not None:
            raise Refused(errno.EACCES, f"{syscall} would create a denied path", full, pattern)
        return parent, leaf

    def _open(self, caller: Caller, base: int, path: str, flags: int, mode: int, opened: list[int]) -> Any:
        cloexec = os.O_CLOEXEC if flags & os.O_CLOEXEC else 0
        if not path:  # one of the caller's descriptors, reopened: nothing is created
            if _on_procfs(base):
                raise Refused(errno.EACCES)
            return ("fd", os.open(f"/proc/thread-self/fd/{base}", flags & ~os.O_CREAT | os.O_CLOEXEC), cloexec)
        for _ in range(MAX_SYMLINKS):
            parent, leaf = self._creation_target(caller, base, path, opened, "open")
            try:
                return ("fd", os.open(leaf, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=parent), cloexec)
            except OSError as exc:
                if exc.errno != errno.ELOOP or flags & (os.O_NOFOLLOW | os.O_EXCL):
                    raise
            # The leaf is a symbolic link: the kernel would follow it and create its target.
            target = os.readlink(leaf, dir_fd=parent)
            base, path = parent, target
        raise Refused(errno.ELOOP)


def _raise(exc: OSError) -> None:
    raise exc


def forget_environment() -> None:
    """Empty this process's environment, including the block /proc/<pid>/environ shows (a fork keeps
    its parent's): the supervisor holds nothing of adl-exec's environment."""
    os.environ.clear()
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    start, end = int(fields[47]), int(fields[48])  # env_start, env_end (fields 50 and 51)
    if 0 < start < end:
        ctypes.memset(start, 0, end - start)


def _syscall_fd(number: int, *args: int) -> int:
    fd = _libc.syscall(number, *(ctypes.c_long(a) for a in args))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))
    return int(fd)


def _set_times(path: str, name: str, times: bytes | None) -> None:
    """utime/utimes/futimesat/utimensat with the caller's times, as one utimensat on `path`."""
    spec = None
    if times is not None:
        if name == "utimensat":
            spec = times
        elif name == "utime":  # struct utimbuf: seconds
            atime, mtime = struct.unpack("=qq", times)
            spec = struct.pack("=qqqq", atime, 0, mtime, 0)
        else:  # struct timeval[2]
            a_s, a_us, m_s, m_us = struct.unpack("=qqqq", times)
            spec = struct.pack("=qqqq", a_s, a_us * 1000, m_s, m_us * 1000)
    buf = None if spec is None else ctypes.create_string_buffer(spec, len(spec))
    if _libc.utimensat(AT_FDCWD, os.fsencode(path), buf, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _real(fd: int) -> str:
    return os.readlink(f"/proc/thread-self/fd/{fd}")


_PROC_SUPER_MAGIC = 0x9FA0
_libc.fstatfs.argtypes = (ctypes.c_int, ctypes.c_void_p)


def _on_procfs(fd: int) -> bool:
    buf = ctypes.create_string_buffer(128)
    if _libc.fstatfs(fd, buf) != 0:
        return True  # unknown: treat as /proc
    return struct.unpack_from("=l", buf)[0] == _PROC_SUPER_MAGIC


def _safe_mode(mode: int) -> int:
    """Permission bits for a new file: never setuid or setgid (seccomp refuses them on chmod too)."""
    return mode & 0o1777


def _parse_status(tid: int, status: bytes) -> Caller:
    tgid = int(re.search(rb"^Tgid:\s*(\d+)", status, re.M).group(1))  # type: ignore[union-attr]
    umask = re.search(rb"^Umask:\s*([0-7]+)", status, re.M)
    return Caller(tid, tgid, int(umask.group(1), 8) if umask else 0o022)


def _read_c_string(fd: int, address: int) -> str:
    """Raises OSError when the memory cannot be read (unmapped, or the descriptor is stale) or holds
    no NUL within PATH_MAX bytes."""
    data = b""
    while len(data) <= PATH_MAX:
        at = address + len(data)
        chunk = os.pread(fd, 4096 - at % 4096, at)
        if not chunk:
            raise OSError(errno.EFAULT, "memory not readable")
        end = chunk.find(b"\0")
        if end >= 0:
            return os.fsdecode(data + chunk[:end])
        data += chunk
    raise OSError(errno.ENAMETOOLONG, "path too long")


def _proc_view(path: str, caller: Caller) -> str:
    """Paths that name "self" mean the caller, not the supervisor."""
    own = f"/proc/{caller.tgid}"
    for prefix, replacement in (
        ("/proc/self", own),
        ("/proc/thread-self", f"{own}/task/{caller.tid}"),
        ("/dev/fd", f"{own}/fd"),
        ("/dev/stdin", f"{own}/fd/0"),
        ("/dev/stdout", f"{own}/fd/1"),
        ("/dev/stderr", f"{own}/fd/2"),
    ):
        if path == prefix or path.startswith(prefix + "/"):
            return replacement + path[len(prefix) :]
    return path
