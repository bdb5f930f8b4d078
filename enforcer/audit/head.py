"""Checkpoints and HEAD.json. A checkpoint record is signed over its own content, `prev` included,
and so seals the whole chain before it; HEAD.json is the signed (seq, hash) of the newest durable
checkpoint, which lets verify notice a log cut off after it. Several writers share one HEAD: an
update that would move it back is skipped."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric import ed25519

from . import keys
from .appender import Receipt
from .chain import Signer
from .logfiles import sync_directory
from .records import canonical, format_ts

HEAD_FILE = "HEAD.json"
HEAD_LOCK = "HEAD.lock"


def checkpoint_payload(sealed_seq: int, key_id: str) -> dict[str, Any]:
    return {"sealed_seq": sealed_seq, "key_id": key_id}


def checkpoint_signer(key: ed25519.Ed25519PrivateKey, key_id: str) -> Signer:
    """The `sig` member of a checkpoint record: Ed25519 over the canonical record without it."""

    def sign(record: dict[str, Any]) -> dict[str, Any]:
        return {"alg": "Ed25519", "kid": key_id, "value": keys.b64url(key.sign(canonical(record)))}

    return sign


def signed_head(receipt: Receipt, key: ed25519.Ed25519PrivateKey, key_id: str, ts_ns: int) -> dict[str, Any]:
    head: dict[str, Any] = {
        "log_id": receipt.log_id,
        "seq": receipt.seq,
        "hash": receipt.hash,
        "ts": format_ts(ts_ns),
        "key_id": key_id,
    }
    head["sig"] = keys.b64url(key.sign(canonical(head)))
    return head


HEAD_MAX_BYTES = 1 << 16  # a signed head is a few hundred bytes


def read_head_file(path: Path) -> bytes | None:
    """The bytes of the HEAD.json at `path`, None if there is none. Never through a symlink, never
    waiting on a FIFO or reading without end (whoever can write the directory may plant either):
    ValueError for what is not a regular file of at most HEAD_MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ValueError(f"{path.name} is a symlink") from None
        raise
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path.name} is not a regular file")
        data = f.read(HEAD_MAX_BYTES + 1)
    if len(data) > HEAD_MAX_BYTES:
        raise ValueError(f"{path.name} is larger than a head")
    return data


def replace_head(directory: Path, head: dict[str, Any], tmp_tag: str) -> bool:
    """Make `head` the directory's HEAD.json, atomically and durably, unless the current one names a
    checkpoint at least as new. The caller holds HEAD.lock. Whether it was replaced."""
    head_path = directory / HEAD_FILE
    try:
        data = read_head_file(head_path)
        current = orjson.loads(data) if data is not None else None
    except ValueError:  # not JSON, not a regular file: replaced
        current = None
    seq = current.get("seq") if isinstance(current, dict) else None
    if type(seq) is int and seq >= head["seq"]:
        return False
    tmp = head_path.with_suffix(f".tmp.{tmp_tag}")
    # Created here, never opened through what is there (a crash's leftover, or a symlink planted by
    # whoever can write the directory: root would write the file it names). 0644 whatever the umask:
    # HEAD.json is public, never writable by the directory's group.
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with open(fd, "wb") as out:
        out.write(orjson.dumps(head, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, head_path)
    sync_directory(directory)
    return True


class Head:
    """One writer's way to HEAD.json: its updates are ordered by a thread lock within the writer and
    by a flock on HEAD.lock across writers."""

    def __init__(
        self, directory: Path, key: ed25519.Ed25519PrivateKey, key_id: str, tag: str, clock: Callable[[], int]
    ) -> None:
        self.directory, self._key, self._key_id, self._tag, self._clock = directory, key, key_id, tag, clock
        self._lock = threading.Lock()
        flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # never a file a planted link names
        self._lock_fd = os.open(directory / HEAD_LOCK, flags, 0o640)
        self.since = 0.0  # when the update now in progress started (0.0: none), for stalled_s

    def write(self, receipt: Receipt) -> None:
        """Point HEAD at the checkpoint `receipt`, which must be durable already."""
        with self._lock:
            self.since = time.monotonic()
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                try:
                    head = signed_head(receipt, self._key, self._key_id, self._clock())
                    replace_head(self.directory, head, self._tag)
                finally:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                self.since = 0.0

    def close(self) -> None:
        os.close(self._lock_fd)
