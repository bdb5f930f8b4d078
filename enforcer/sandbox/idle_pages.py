"""Pages of extension modules a waiting launcher maps for nothing, left to the page cache.

A launcher waits for its session for the session's whole life, still mapping every page of the
extension modules its launch path touched: cryptography's Rust module (the audit key, signatures)
alone maps much of its large file, which no other process maps. Once a session has run for a while
(RELEASE_AFTER_S), `release()` drops this process's mappings of those pages (madvise
MADV_DONTNEED): a later access faults each back in from the page cache (the session's end signs its
evidence), as after the kernel reclaimed it.

Only mappings that cannot change under the call: a loaded extension module's (Python never unloads
one, so no other thread can unmap it and have the address reused meanwhile), not writable (no page
can be written into it meanwhile), holding no anonymous page (relocations, copy-on-write: what was
written there, which MADV_DONTNEED would discard).
"""

from __future__ import annotations

import ctypes
import os
import sys

from .pidns import LIBC

MADV_DONTNEED = 4
RELEASE_AFTER_S = 1.0  # sessions shorter than this never pay for the release nor the faults after it


def extension_files() -> set[str]:
    """The files of the extension modules loaded in this process, as /proc/PID/smaps names them."""
    files = set()
    for module in list(sys.modules.values()):  # a copy: another thread may import meanwhile
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".so"):
            files.add(os.path.realpath(path))
    return files


def releasable(smaps: str, files: set[str]) -> list[tuple[int, int]]:
    """(start, length) of each mapping in /proc/PID/smaps text of one of `files` that is not
    writable and holds no anonymous page."""
    found: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    for line in smaps.splitlines():
        fields = line.split(maxsplit=5)
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping: "start-end perms offset dev inode [path]"
            current = None
            if len(fields) == 6 and fields[5] in files and "w" not in fields[1]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                current = (start, end - start)
        elif fields[0] == "Anonymous:" and current is not None:
            if int(fields[1]) == 0:
                found.append(current)
            current = None
    return found


def release() -> int:
    """Drop this process's mappings of its extension modules' clean read-only pages (see above);
    returns the bytes of the mappings released. Memory only: what cannot be read or released (no
    /proc, no descriptor left, locked pages) stays as it is, and the session goes on."""
    files = extension_files()
    try:
        with open("/proc/self/smaps", encoding="utf-8", errors="surrogateescape") as f:
            mappings = releasable(f.read(), files)
    except OSError:
        return 0
    released = 0
    for start, length in mappings:
        if LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), MADV_DONTNEED) == 0:
            released += length
    return released
