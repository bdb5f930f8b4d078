"""The chained audit log writer.

Several processes may write one directory (adl-exec sessions and the daemon): every append takes an
exclusive flock on `audit.lock`, notices when another writer has appended or rotated since (file size
changed) and re-reads the tail, so the chain stays single and gap-free. An append returns after the
line is in the kernel (a SIGKILL of the writer cannot lose it); durability against power loss comes
from group commit (fdatasync every `group_records` records or `group_ms` milliseconds) or `sync=True`.

Directory layout:
  audit-<first seq, 16 digits>.jsonl   the log, rotated by size and age; the chain runs across files
  HEAD.json                            signed (seq, hash) of the newest durable checkpoint: catches truncation
  HEAD.lock, audit.lock                flock targets ordering HEAD updates and appends across writers
  writers/<id>                         one per live writer, flock-held; a lockable one is a dead writer
  torn/                                bytes of a torn last line moved aside after a crash
"""

from __future__ import annotations

import abc
import fcntl
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import orjson

from . import keys, records
from .records import GENESIS, canonical, format_ts, parse_line

LOG_GLOB = "audit-*.jsonl"
HEAD_FILE = "HEAD.json"


class AuditUnavailable(Exception):
    """A record could not be written. The caller must treat the action it was recording as denied."""


class AuditStalled(AuditUnavailable):
    """Another append or sync of this writer has not finished within WriterSettings.lock_wait_s."""


class RecordRejected(AuditUnavailable):
    """One entry of an append cannot be encoded as a record. Nothing of that append was written and
    the log is still usable: the entry is the problem, not the log."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"entry {index} cannot be encoded: {detail}")
        self.index = index


class Entry(NamedTuple):
    """One record for append_many."""

    kind: str
    payload: dict[str, Any]
    corr: str | None = None
    trace: dict[str, str] | None = None
    priority: str = "normal"


class Receipt(NamedTuple):
    seq: int
    hash: str
    log_id: str  # the record's id is "<log_id>.<seq>"


@dataclass(frozen=True)
class WriterSettings:
    group_records: int = 256
    group_ms: float = 5.0
    checkpoint_records: int = 1000
    checkpoint_seconds: float = 60.0
    rotate_bytes: int = 64 * 1024 * 1024
    rotate_seconds: float = 24 * 3600.0
    background_flush: bool = False  # a thread that honours group_ms while the log is idle
    lock_wait_s: float = -1  # an append or sync waiting longer for another one fails (-1: no limit)


def log_name(first_seq: int) -> str:
    return f"audit-{first_seq:016d}.jsonl"


def log_files(directory: Path) -> list[Path]:
    return sorted(directory.glob(LOG_GLOB))


def read_tail(path: Path) -> tuple[bytes | None, int, bytes]:
    """(last complete line, offset where the complete lines end, torn bytes after them)."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return None, 0, b""
        chunk, pos, data = 65536, size, b""
        while pos > 0:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
            cut = data.rfind(b"\n", 0, len(data) - 1 if data.endswith(b"\n") else len(data))
            if cut >= 0 or pos == 0:
                break
        end = data.rfind(b"\n") + 1  # end of the last complete line within `data`
        torn = data[end:]
        complete = data[:end]
        start = complete.rfind(b"\n", 0, len(complete) - 1) + 1
        last = complete[start:-1] if complete else None
        return last, pos + end, torn


class Appender(abc.ABC):
    """Something records are appended to: append() is one entry of append_many()."""

    @abc.abstractmethod
    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        """Append `entries` in order; with `sync`, return once they are on stable storage."""

    def append(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        corr: str | None = None,
        trace: dict[str, str] | None = None,
        priority: str = "normal",
        sync: bool = False,
    ) -> Receipt:
        return self.append_many((Entry(kind, payload, corr, trace, priority),), sync=sync)[0]


class AuditWriter(Appender):
    def __init__(
        self,
        directory: str | os.PathLike[str],
        key_path: str | os.PathLike[str],
        *,
        source: str = "adl-enforcer",
        settings: WriterSettings | None = None,
        clock: Callable[[], int] = time.time_ns,
    ) -> None:
        self.directory = Path(directory)
        self.key_path = Path(key_path)
        self.settings = settings or WriterSettings()
        self.source = source
        self._clock = clock
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        self._failed: Exception | None = None
        self._fd = -1
        self._size = 0
        self._file = Path()
        self._file_started_ns = 0
        self._seq = 0
        self._hash = GENESIS
        self._log_id = ""
        self._durable_seq = 0
        self._unsynced = 0
        self._last_sync_ns = clock()
        self._since_checkpoint = 0
        self._last_checkpoint_ns = clock()
        self.writer_id = secrets.token_hex(8)
        self._default_corr = f"writer-{self.writer_id}"
        self._now = clock()
        self._next_due_ns = self._due_seq = self._due_size = 0  # see _schedule_due
        self._leased = False
        self._stop_flusher = threading.Event()
        self._flush_wanted = threading.Event()
        self._group_for_flusher: tuple[int, int] | None = None  # (dup of the log fd, last seq in it)
        self._pending_head: Receipt | None = None
        self._head_lock = threading.Lock()
        self._flusher: threading.Thread | None = None
        # When the append, fdatasync and HEAD update now in progress started (0.0: none): see stalled_s.
        self._append_since = self._sync_since = self._head_since = 0.0
        try:
            self._key = keys.load_or_create(Path(key_path))
            self._key_id = keys.key_id(self._key.public_key())
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o750)
            (self.directory / "writers").mkdir(exist_ok=True, mode=0o750)
            self._lock_fd = os.open(self.directory / "audit.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
            self._head_lock_fd = os.open(self.directory / "HEAD.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
            self._registry_fd = -1
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            try:
                self._open_latest()
                self._reap_dead_writers()
                self._register()
            finally:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
        except (OSError, keys.AuditKeyError, records.RecordError) as exc:
            raise AuditUnavailable(f"cannot open the audit log in {self.directory}: {exc}") from exc
        if self.settings.background_flush:
            self._flusher = threading.Thread(target=self._flush_loop, name="audit-flush", daemon=True)
            self._flusher.start()

    # -- public API -------------------------------------------------------------------------------

    @property
    def log_id(self) -> str:
        return self._log_id

    @property
    def signing_key(self) -> Any:
        """The sealing key, for signed records built outside the writer (session evidence)."""
        return self._key

    @property
    def durable_seq(self) -> int:
        """The last seq known to be on stable storage."""
        return self._durable_seq

    @property
    def failed(self) -> Exception | None:
        return self._failed

    def stalled_s(self) -> float:
        """How long the oldest append, fdatasync or HEAD update still in progress has been going on
        (0.0: none is). Read without a lock, so that a stuck write cannot hide itself."""
        started = [t for t in (self._append_since, self._sync_since, self._head_since) if t]
        return time.monotonic() - min(started) if started else 0.0

    def _acquire(self, lock: threading.Lock) -> None:
        if not lock.acquire(timeout=self.settings.lock_wait_s):
            raise AuditStalled(f"audit log stalled: another write has not finished in {self.settings.lock_wait_s} s")

    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        """Append `entries` in order, chained exactly as one append each, with one lock and one
        write(2): every receipt is returned after all of them are in the kernel, or none is. An
        entry that cannot be encoded raises RecordRejected and nothing is written."""
        if not entries:
            return []
        self._acquire(self._lock)
        try:
            self._append_since = time.monotonic()
            self._check_usable()
            try:
                self._take_lock()
                data, receipts = self._lines(entries)
                self._put(data)
                if self._now >= self._next_due_ns or self._seq >= self._due_seq or self._size >= self._due_size:
                    self._maybe_checkpoint_and_rotate()
                    if not sync:
                        self._maybe_group_commit()
                    self._schedule_due()
            except RecordRejected:
                if self._flusher is None:
                    self._release_lease()
                raise
            except (OSError, records.RecordError, ValueError, TypeError) as exc:
                self._failed = exc
                self._release_lease()
                raise AuditUnavailable(f"audit record not written: {exc}") from exc
            if self._flusher is None or self._failed is not None:
                self._release_lease()
        finally:
            self._append_since = 0.0
            self._lock.release()
        if sync:
            self.sync(receipts[-1].seq)
        return receipts

    def _lines(self, entries: Sequence[Entry]) -> tuple[bytes, list[Receipt]]:
        """The entries' lines, chained. If one cannot be encoded the chain is put back as it was."""
        saved = (self._seq, self._hash, self._unsynced, self._since_checkpoint, self._now)
        lines: list[bytes] = []
        receipts: list[Receipt] = []
        try:
            if len(entries) == 1:  # most appends: no lists to build and join
                data, receipt = self._line(*entries[0])  # an Entry holds _line's arguments, in order
                return data, [receipt]
            for entry in entries:
                line, receipt = self._line(*entry)
                lines.append(line)
                receipts.append(receipt)
            return b"".join(lines), receipts
        except (TypeError, ValueError) as exc:  # the encoder refused the entry's content
            self._seq, self._hash, self._unsynced, self._since_checkpoint, self._now = saved
            raise RecordRejected(len(receipts), str(exc)) from exc

    def sync(self, upto_seq: int | None = None) -> None:
        """Return once every record this writer wrote (up to `upto_seq`) is on stable storage."""
        self._acquire(self._sync_lock)
        try:
            if upto_seq is not None and self._durable_seq >= upto_seq:
                return
            self._acquire(self._lock)
            try:
                self._check_usable()
                fd, target = os.dup(self._fd), self._seq
            finally:
                self._lock.release()
            self._sync_dup(fd, target)
            with self._lock:
                self._unsynced = max(self._seq - self._durable_seq, 0)
                self._last_sync_ns = self._clock()
        finally:
            self._sync_lock.release()

    def _sync_dup(self, fd: int, target: int) -> None:
        """fdatasync a duplicate of the log's descriptor (a rotation may close the original
        meanwhile), then mark every record up to `target` durable. Caller holds _sync_lock."""
        self._sync_since = time.monotonic()
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self._failed = exc
            raise AuditUnavailable(f"audit log not durable: {exc}") from exc
        finally:
            self._sync_since = 0.0
            os.close(fd)
        self._durable_seq = max(self._durable_seq, target)

    def checkpoint(self) -> Receipt:
        with self._lock:
            self._check_usable()
            self._append_since = time.monotonic()
            try:
                self._take_lock()
                return self._write_checkpoint()
            except (OSError, records.RecordError) as exc:
                self._failed = exc
                raise AuditUnavailable(f"checkpoint not written: {exc}") from exc
            finally:
                self._append_since = 0.0
                self._release_lease()

    def close(self) -> None:
        """Seal with a checkpoint and a writer.close record; the log is then cleanly stopped."""
        self._stop_flusher.set()
        self._flush_wanted.set()
        if self._flusher:
            self._flusher.join(timeout=5)
        with self._lock:
            if self._group_for_flusher is not None and not (self._flusher and self._flusher.is_alive()):
                os.close(self._group_for_flusher[0])  # the flusher stopped (a failure) before syncing it
                self._group_for_flusher = None
            if self._fd < 0:
                return
            try:
                if self._failed is None:
                    self._take_lock()
                    self._write(records.WRITER_CLOSE, {"writer": self.writer_id, "pid": os.getpid()})
                    self._write_checkpoint()
            finally:
                self._release_lease()
                os.close(self._fd)
                self._fd = -1
                if self._registry_fd >= 0:
                    (self.directory / "writers" / self.writer_id).unlink(missing_ok=True)
                    os.close(self._registry_fd)
                os.close(self._lock_fd)
                os.close(self._head_lock_fd)

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------------

    def _release_lease(self) -> None:
        """Let other writers in. With a flusher thread the lock is kept across a burst of appends
        and released at each group commit (so another writer waits at most about group_ms), which
        saves two syscalls per record; without one it is released after every append."""
        if self._leased:
            self._leased = False
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise AuditUnavailable(f"audit log failed earlier and is closed to writes: {self._failed}")
        if self._fd < 0:
            raise AuditUnavailable("audit log is closed")

    def _take_lock(self) -> None:
        if not self._leased:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
            self._leased = True
            if os.fstat(self._fd).st_size != self._size:
                self._load_tail()  # another writer appended or rotated since we last held it

    def _open_latest(self) -> None:
        files = log_files(self.directory)
        if not files:
            self._log_id = secrets.token_hex(8)
            self._switch_to(self.directory / log_name(1), create=True)
            self._write(
                records.LOG_OPEN,
                {
                    "log_id": self._log_id,
                    "key_id": self._key_id,
                    "public_key": keys.b64url(keys.raw_public(self._key.public_key())),
                },
            )
            self.sync()
            return
        self._log_id = _first_record(files[0]).get("payload", {}).get("log_id", "")
        self._switch_to(files[-1], create=False)
        self._load_tail()

    def _switch_to(self, path: Path, *, create: bool) -> None:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o640)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._file = fd, path
        self._size = os.fstat(fd).st_size
        if create:
            self._file_started_ns = self._clock()
        else:
            first = _first_record(path)
            self._file_started_ns = records.parse_ts(first["ts"]) if "ts" in first else self._clock()

    def _load_tail(self) -> None:
        """Take seq and hash from the last record; repair a torn line; follow a rotation marker."""
        while True:
            last, end, torn = read_tail(self._file)
            gap = self._set_torn_aside(end, torn) if torn else None
            raw = last if last is not None else self._previous_file_tail()
            record = parse_line(raw)
            problem = records.check_line_hash(raw)
            if problem:
                raise records.RecordError(f"last record before {self._file.name}'s end does not verify ({problem})")
            self._seq, self._hash = record["seq"], record["hash"]
            self._size = os.fstat(self._fd).st_size
            if gap:
                self._write(records.GAP, gap, priority="high")
            if records.kind_of(record) != records.ROTATE or last is None:
                return
            self._switch_to(self.directory / record["payload"]["next_file"], create=False)

    def _previous_file_tail(self) -> bytes:
        """The last record before an empty current file (a rotation interrupted by a crash)."""
        files = log_files(self.directory)
        index = files.index(self._file) if self._file in files else 0
        if index == 0:
            raise records.RecordError(f"{self._file.name} holds no complete record")
        last, _, _ = read_tail(files[index - 1])
        if last is None:
            raise records.RecordError(f"{files[index - 1].name} holds no complete record")
        return last

    def _set_torn_aside(self, end: int, torn: bytes) -> dict[str, Any]:
        """Move the bytes of a torn last line to torn/ and cut the log back to its last whole line."""
        aside_dir = self.directory / "torn"
        aside_dir.mkdir(exist_ok=True, mode=0o750)
        aside = aside_dir / f"{self._file.name}.{end}"
        with open(aside, "wb") as out:
            out.write(torn)
            out.flush()
            os.fsync(out.fileno())
        os.truncate(self._file, end)
        os.fsync(self._fd)
        return {
            "reason": "torn_write",
            "file": self._file.name,
            "offset": end,
            "bytes": len(torn),
            "fragment_sha256": hashlib.sha256(torn).hexdigest(),
            "saved_as": f"torn/{aside.name}",
        }

    def _write(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        priority: str = "normal",
        sig_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> Receipt:
        """One of the writer's own records (open, close, gap, checkpoint, rotate), under the locks
        its caller holds; they carry the writer's default corr and no trace."""
        line, receipt = self._line(kind, payload, None, None, priority, sig_fn)
        self._put(line)
        return receipt

    def _line(
        self,
        kind: str,
        payload: dict[str, Any],
        corr: str | None,
        trace: dict[str, str] | None,
        priority: str,
        sig_fn: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> tuple[bytes, Receipt]:
        """The next record's line, chained onto the last one. The writer's state moves on before the
        line is written: if _put then fails the writer is failed and never appends again."""
        seq = self._seq + 1
        now = self._clock()
        head, tail = records.envelope_parts(
            log_id=self._log_id,
            seq=seq,
            prev=self._hash,
            ts_ns=now,
            kind=kind,
            source=self.source,
            corr=corr or self._default_corr,
            payload=payload,
            trace=trace,
            priority=priority,
        )
        if sig_fn is None:
            digest = hashlib.sha256(head + tail).hexdigest()
            line = b"".join((head, b',"hash":"', digest.encode(), b'"', tail, b"\n"))
        else:  # checkpoints only (one in thousands): parsing the body back is cheap enough
            record = orjson.loads(head + tail)
            record["sig"] = sig_fn(record)
            body = canonical(record)
            digest = hashlib.sha256(body).hexdigest()
            line = records.with_hash(body, digest)
        self._seq, self._hash = seq, digest
        self._unsynced += 1
        self._since_checkpoint += 1
        self._now = now
        return line, Receipt(seq, digest, self._log_id)

    def _put(self, data: bytes) -> None:
        written = os.write(self._fd, data)
        while written < len(data):  # short writes are rare (signals, quotas) but must not tear a line
            written += os.write(self._fd, data[written:])
        self._size += len(data)

    def _schedule_due(self) -> None:
        """Three cheap tests per append instead of six method-level ones: the earliest time, seq and
        size at which a group commit, checkpoint or rotation may be due. Early is harmless (the
        maybe_ methods decide and this is refreshed after them). While the flusher is still syncing
        the last group, the next one is looked at a group later; the flusher pulls that in when done."""
        settings = self.settings
        busy = self._group_for_flusher is not None
        synced_ns = self._now if busy else self._last_sync_ns
        self._next_due_ns = min(
            synced_ns + int(settings.group_ms * 1e6),
            self._last_checkpoint_ns + int(settings.checkpoint_seconds * 1e9),
            self._file_started_ns + int(settings.rotate_seconds * 1e9),
        )
        self._due_seq = self._seq + min(
            settings.group_records - (0 if busy else self._unsynced),
            settings.checkpoint_records - self._since_checkpoint,
        )
        self._due_size = settings.rotate_bytes

    def _maybe_group_commit(self) -> None:
        due = self._unsynced >= self.settings.group_records or (
            self._now - self._last_sync_ns >= self.settings.group_ms * 1e6
        )
        if not due:
            return
        if self._flusher is None:
            self._sync_locked()
        elif self._group_for_flusher is None:
            # Hand the group over instead of letting the flusher take self._lock: under a stream of
            # appends a waiting flusher was woken (and lost the lock again) at every append's release.
            self._group_for_flusher = (os.dup(self._fd), self._seq)
            self._unsynced, self._last_sync_ns = 0, self._now
            self._release_lease()  # other writers get their turn once per group
            self._flush_wanted.set()

    def _sync_locked(self) -> None:
        """fdatasync on the append path (caller holds the locks)."""
        os.fdatasync(self._fd)
        self._durable_seq, self._unsynced, self._last_sync_ns = self._seq, 0, self._clock()

    def _maybe_checkpoint_and_rotate(self) -> None:
        now, settings = self._now, self.settings
        if self._since_checkpoint >= settings.checkpoint_records or (
            now - self._last_checkpoint_ns >= settings.checkpoint_seconds * 1e9
        ):
            self._write_checkpoint(head_later=self._flusher is not None)
        if self._size >= settings.rotate_bytes or now - self._file_started_ns >= settings.rotate_seconds * 1e9:
            self._rotate()

    def _write_checkpoint(self, *, head_later: bool = False) -> Receipt:
        """A checkpoint record whose signature covers its own content, `prev` included, and so the
        whole chain before it; then HEAD.json, which lets verify notice a cut-off log.

        HEAD may only name a durable checkpoint. With `head_later` the flusher thread writes it
        after its next fdatasync, which keeps two fsyncs off the append path."""
        sealed = self._seq

        def sign(record: dict[str, Any]) -> dict[str, Any]:
            return {"alg": "Ed25519", "kid": self._key_id, "value": keys.b64url(self._key.sign(canonical(record)))}

        receipt = self._write(records.CHECKPOINT, {"sealed_seq": sealed, "key_id": self._key_id}, sig_fn=sign)
        self._since_checkpoint, self._last_checkpoint_ns = 0, self._clock()
        if head_later:
            self._pending_head = receipt
            self._flush_wanted.set()
        else:
            self._sync_locked()
            self._pending_head = None
            self._write_head(receipt)
        return receipt

    def _write_head(self, receipt: Receipt) -> None:
        with self._head_lock:  # threads of this writer; the flock below orders other writers
            self._head_since = time.monotonic()
            try:
                fcntl.flock(self._head_lock_fd, fcntl.LOCK_EX)
                try:
                    self._replace_head(receipt)
                finally:
                    fcntl.flock(self._head_lock_fd, fcntl.LOCK_UN)
            finally:
                self._head_since = 0.0

    def _replace_head(self, receipt: Receipt) -> None:
        head_path = self.directory / HEAD_FILE
        try:
            current = orjson.loads(head_path.read_bytes())
            if isinstance(current, dict) and current.get("seq", 0) >= receipt.seq:
                return
        except (FileNotFoundError, orjson.JSONDecodeError):
            pass
        head: dict[str, Any] = {
            "log_id": self._log_id,
            "seq": receipt.seq,
            "hash": receipt.hash,
            "ts": format_ts(self._clock()),
            "key_id": self._key_id,
        }
        head["sig"] = keys.b64url(self._key.sign(canonical(head)))
        tmp = head_path.with_suffix(f".tmp.{self.writer_id}")
        with open(tmp, "wb") as out:
            out.write(orjson.dumps(head, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, head_path)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def _rotate(self) -> None:
        """Seal the current file, point it at the next one, and continue the chain there."""
        self._write_checkpoint()
        next_file = log_name(self._seq + 2)  # the rotate record takes seq + 1
        self._write(records.ROTATE, {"next_file": next_file})
        self._sync_locked()
        self._switch_to(self.directory / next_file, create=True)

    def _register(self) -> None:
        entry = self.directory / "writers" / self.writer_id
        fd = os.open(entry, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        started = format_ts(self._clock())
        os.write(fd, orjson.dumps({"writer": self.writer_id, "pid": os.getpid(), "started": started}))
        self._registry_fd = fd
        self._write(
            records.WRITER_OPEN,
            {"writer": self.writer_id, "pid": os.getpid(), "uid": os.getuid(), "key_id": self._key_id},
        )

    def _reap_dead_writers(self) -> None:
        """A registry entry nobody holds belongs to a writer that stopped without closing: say so."""
        for entry in sorted((self.directory / "writers").iterdir()):
            fd = os.open(entry, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                info = orjson.loads(os.read(fd, 4096) or b"{}")
            except orjson.JSONDecodeError:
                info = {}
            self._write(
                records.GAP,
                {
                    "reason": "writer_stopped_uncleanly",
                    "writer": info.get("writer", entry.name),
                    "pid": info.get("pid"),
                    "started": info.get("started"),
                    "last_seq_before_detection": self._seq,
                },
                priority="high",
            )
            entry.unlink()
            os.close(fd)
        os.fdatasync(self._fd)

    def _flush_loop(self) -> None:
        """Syncs the groups that appends hand over and, when appends pause, whatever they left
        unsynced (so group_ms holds on an idle log); then writes HEAD for a durable checkpoint."""
        interval = max(self.settings.group_ms / 1000.0, 0.001)
        while not self._stop_flusher.is_set():
            self._flush_wanted.wait(interval)
            self._flush_wanted.clear()
            if self._failed is not None or self._fd < 0:
                return
            handed = self._group_for_flusher
            group = handed or self._idle_group()
            if group is not None:
                try:
                    with self._sync_lock:
                        self._sync_dup(*group)
                except AuditUnavailable:
                    return
                finally:
                    if handed is not None:
                        self._group_for_flusher = None  # only the flusher empties the slot, appends fill it
                        self._next_due_ns = 0  # the next append hands over what gathered meanwhile
            head = self._pending_head
            if head is not None and self._durable_seq >= head.seq:
                try:
                    self._write_head(head)
                except OSError as exc:
                    self._failed = exc
                    return
                if self._pending_head is head:
                    self._pending_head = None

    def _idle_group(self) -> tuple[int, int] | None:
        """When appends have paused: the unsynced tail, and the flock lease given back so other
        writers are not kept out by an idle one. Never waits for the lock: if an append holds it,
        appends are going on and will hand over their group and the lease themselves."""
        if not (self._unsynced or self._leased) or not self._lock.acquire(blocking=False):
            return None
        try:
            group = None
            if self._fd >= 0 and self._unsynced:
                group = (os.dup(self._fd), self._seq)
                self._unsynced, self._last_sync_ns = 0, self._clock()
            self._release_lease()
            return group
        finally:
            self._lock.release()


def _first_record(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        line = f.readline()
    return parse_line(line) if line.endswith(b"\n") else {}
