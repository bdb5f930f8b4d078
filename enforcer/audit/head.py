"""Checkpoints and HEAD.json. A checkpoint record is signed over its own content, `prev` included,
and so seals the whole chain before it; HEAD.json is the signed (seq, hash) of the newest durable
checkpoint, which lets verify notice a log cut off after it. Several writers share one HEAD: an
update that would move it back is skipped."""

from __future__ import annotations

import contextlib
import fcntl
import os
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


def replace_head(directory: Path, head: dict[str, Any], tmp_tag: str) -> bool:
    """Make `head` the directory's HEAD.json, atomically and durably, unless the current one names a
    checkpoint at least as new. The caller holds HEAD.lock. Whether it was replaced."""
    head_path = directory / HEAD_FILE
    try:
        current = orjson.loads(head_path.read_bytes())
        if isinstance(current, dict) and current.get("seq", 0) >= head["seq"]:
            return False
    except (FileNotFoundError, orjson.JSONDecodeError):
        pass
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
