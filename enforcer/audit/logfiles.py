"""The log's files: `audit-<first seq, 16 digits>.jsonl`, how they are named, listed and opened, and
how the last record is found at the end of one, a torn last line included."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from . import records
from .records import parse_line

LOG_GLOB = "audit-*.jsonl"
TORN_DIR = "torn"


def log_name(first_seq: int) -> str:
    return f"audit-{first_seq:016d}.jsonl"


def rotation_target(rotate: dict[str, Any]) -> str:
    """The file a rotation record names, which must be the next log file of its directory: followed
    as named, a record written by whoever could edit the log would have any file read or written.
    RecordError when it names anything else, or nothing."""
    seq, payload = rotate.get("seq"), rotate.get("payload")
    named = payload.get("next_file") if isinstance(payload, dict) else None
    if not isinstance(seq, int) or named != log_name(seq + 1):
        raise records.RecordError(f"the rotation record at seq {seq} names {named!r}, not the next log file")
    return log_name(seq + 1)


def log_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(LOG_GLOB))


def open_log(path: Path, *, create: bool) -> int:
    """A descriptor that appends to `path`; with `create`, the file must not exist yet. Never through
    a symlink: whoever could plant one in the directory would have records appended to its target;
    nor waiting on a FIFO planted there (ENXIO while nobody reads it): OSError for what is not a
    regular file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    fd = os.open(path, flags | (os.O_CREAT | os.O_EXCL if create else 0), 0o640)
    try:
        _check_regular(fd, path)
        # Only the open had to not wait: the appends are a regular file's, as before.
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_for_reading(path: Path) -> BinaryIO:
    """`path`, a log file, open for reading: never through a symlink nor waiting on a FIFO (whoever
    can write the directory may plant either under a log file's name). OSError for what is not a
    regular file."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        _check_regular(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return open(fd, "rb")


def _check_regular(fd: int, path: Path) -> None:
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        raise OSError(errno.EINVAL, f"{path.name} is not a regular file")


def read_tail(path: Path) -> tuple[bytes | None, int, bytes]:
    """(last complete line, offset where the complete lines end, torn bytes after them)."""
    with open_for_reading(path) as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None, 0, b""
        chunk, pos, data = 65536, size, b""
        while pos > 0:  # read back until the newline before the last complete line (or the start)
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
            last_newline = data.rfind(b"\n")
            if last_newline > 0 and data.rfind(b"\n", 0, last_newline) >= 0:
                break
        end = data.rfind(b"\n") + 1  # end of the last complete line within `data`
        torn = data[end:]
        complete = data[:end]
        start = complete.rfind(b"\n", 0, len(complete) - 1) + 1
        last = complete[start:-1] if complete else None
        return last, pos + end, torn


def has_checkpoint(directory: Path) -> bool:
    """Whether a log file holds a checkpoint record (read only when HEAD.json is missing)."""
    marker = b'"intent":"' + (records.INTENT_PREFIX + records.CHECKPOINT).encode() + b'"'
    for path in log_files(directory):
        with open_for_reading(path) as f:
            for line in f:
                if marker not in line:
                    continue
                try:
                    if records.kind_of(parse_line(line)) == records.CHECKPOINT:
                        return True
                except records.RecordError:
                    continue
    return False


def first_record(path: Path) -> dict[str, Any]:
    """The first record of a log file ({} while its first line is incomplete)."""
    with open_for_reading(path) as f:
        line = f.readline()
    return parse_line(line) if line.endswith(b"\n") else {}


def started_ns(path: Path) -> int | None:
    """When a log file was begun: the time of its first record (None if it has none yet)."""
    first = first_record(path)
    return records.parse_ts(first["ts"]) if "ts" in first else None


def previous_tail(directory: Path, path: Path) -> bytes:
    """The last record of the file before `path`, for an empty `path` (a rotation interrupted by a
    crash)."""
    files = log_files(directory)
    index = files.index(path) if path in files else 0
    if index == 0:
        raise records.RecordError(f"{path.name} holds no complete record")
    last, _, _ = read_tail(files[index - 1])
    if last is None:
        raise records.RecordError(f"{files[index - 1].name} holds no complete record")
    return last


def sync_directory(directory: Path) -> None:
    """Make the names created or replaced in `directory` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def set_torn_aside(directory: Path, path: Path, fd: int, end: int, torn: bytes) -> dict[str, Any]:
    """Move the bytes of a torn last line of `path` (open as `fd`) to torn/, durably, and cut the
    file back to its last whole line at `end`. The payload of the gap record that says so."""
    aside_dir = directory / TORN_DIR
    aside_dir.mkdir(exist_ok=True, mode=0o750)
    aside = aside_dir / f"{path.name}.{end}"
    # Both names are predictable and the bytes are whoever tore the file's: never written through a
    # symlink planted as torn/ or as the file (root would write them where it points), nor into a
    # FIFO planted as the file (its open would wait for a reader).
    torn_fd = os.open(aside_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        aside_fd = os.open(aside.name, flags, 0o640, dir_fd=torn_fd)
    finally:
        os.close(torn_fd)
    try:
        _check_regular(aside_fd, aside)
    except BaseException:
        os.close(aside_fd)
        raise
    with open(aside_fd, "wb") as out:
        out.write(torn)
        out.flush()
        os.fsync(out.fileno())
    os.ftruncate(fd, end)  # the file the writer opened: `path` may name another by now
    os.fsync(fd)
    return {
        "reason": "torn_write",
        "file": path.name,
        "offset": end,
        "bytes": len(torn),
        "fragment_sha256": hashlib.sha256(torn).hexdigest(),
        "saved_as": f"{TORN_DIR}/{aside.name}",
    }
