"""The chained audit log writer: AuditWriter, over the modules that each do one of its jobs.

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

The writer's jobs, one module each (this one ties them together and runs the flusher thread):
  appender.py    entries, receipts, errors, the Appender type
  chain.py       the record lines and the hash chain
  logfiles.py    the log files: naming, listing, opening, the tail and a torn one
  schedule.py    settings; when a group commit, checkpoint or rotation is due
  head.py        checkpoint signatures and HEAD.json
  registry.py    the writer registry (dead writers) and the append lease
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..paths import make_private_dir
from . import keys, logfiles, records, registry, schedule
from .appender import Appender, AuditStalled, AuditUnavailable, Entry, Receipt, RecordRejected
from .chain import Chain
from .head import HEAD_FILE, Head, checkpoint_payload, checkpoint_signer
from .logfiles import LOG_GLOB, log_files, log_name, read_tail
from .records import format_ts, parse_line
from .schedule import WriterSettings

__all__ = [
    "HEAD_FILE",
    "LOG_GLOB",
    "Appender",
    "AuditStalled",
    "AuditUnavailable",
    "AuditWriter",
    "Entry",
    "Receipt",
    "RecordRejected",
    "WriterSettings",
    "log_files",
    "log_name",
    "read_tail",
]


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
        # Absolute from the start: the egress filter opens its own writer on the same paths after the
        # agent has started, from a working directory the agent may write to.
        self.directory = Path(os.path.abspath(directory))
        self.key_path = Path(os.path.abspath(key_path))
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
        self.writer_id = os.urandom(8).hex()  # what secrets.token_hex does, without importing random
        self._chain = Chain(source, f"writer-{self.writer_id}", clock)
        self._durable_seq = 0
        self._unsynced = 0
        self._last_sync_ns = clock()
        self._since_checkpoint = 0
        self._last_checkpoint_ns = clock()
        self._next_due_ns = self._due_seq = self._due_size = 0  # see _schedule_due
        self._stop_flusher = threading.Event()
        self._flush_wanted = threading.Event()
        self._group_for_flusher: tuple[int, int] | None = None  # (dup of the log fd, last seq in it)
        self._pending_head: Receipt | None = None
        self._flusher: threading.Thread | None = None
        # When the append and fdatasync now in progress started (0.0: none): see stalled_s.
        self._append_since = self._sync_since = 0.0
        self._registry_fd = -1
        try:
            # Checked before anything is created, the key included: a refused directory leaves no trace.
            make_private_dir(self.directory, 0o750)
            self._key = keys.load_or_create(Path(key_path))
            self._key_id = keys.key_id(self._key.public_key())
            self._sign = checkpoint_signer(self._key, self._key_id)
            (self.directory / registry.WRITERS_DIR).mkdir(exist_ok=True, mode=0o750)
            self._lease = registry.Lease(self.directory)
            self._head = Head(self.directory, self._key, self._key_id, self.writer_id, clock)
            self._lease.take()
            try:
                self._open_latest()
                self._reap_dead_writers()
                self._register()
            finally:
                self._lease.release()
        except (OSError, keys.AuditKeyError, records.RecordError) as exc:
            self._release_all()
            raise AuditUnavailable(f"cannot open the audit log in {self.directory}: {exc}") from exc
        if self.settings.background_flush:
            flusher = threading.Thread(target=self._flush_loop, name="audit-flush", daemon=True)
            try:
                flusher.start()
            except RuntimeError as exc:  # out of tasks or memory: a writer without its flusher is not kept
                # Sealed as any writer that stops (its writer.close record, its registry entry gone);
                # if that fails close() has still released every descriptor, and the error says why.
                with contextlib.suppress(AuditUnavailable, OSError, records.RecordError):
                    self.close()
                raise AuditUnavailable(
                    f"cannot open the audit log in {self.directory}: its flusher thread did not start ({exc})"
                ) from exc
            self._flusher = flusher

    # -- public API -------------------------------------------------------------------------------

    @property
    def log_id(self) -> str:
        return self._chain.log_id

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
        started = [t for t in (self._append_since, self._sync_since, self._head.since) if t]
        return time.monotonic() - min(started) if started else 0.0

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
            chain = self._chain
            try:
                self._take_lease()
                data, receipts = chain.lines(entries)
                self._unsynced += len(receipts)
                self._since_checkpoint += len(receipts)
                self._put(data)
                if chain.now >= self._next_due_ns or chain.seq >= self._due_seq or self._size >= self._due_size:
                    self._maybe_checkpoint_and_rotate()
                    if not sync:
                        self._maybe_group_commit()
                    self._schedule_due()
            except RecordRejected:
                if self._flusher is None:
                    self._lease.release()
                raise
            except (OSError, records.RecordError, ValueError, TypeError) as exc:
                self._failed = exc
                self._lease.release()
                raise AuditUnavailable(f"audit record not written: {exc}") from exc
            if self._flusher is None or self._failed is not None:
                self._lease.release()
        finally:
            self._append_since = 0.0
            self._lock.release()
        if sync:
            self.sync(receipts[-1].seq)
        return receipts

    def sync(self, upto_seq: int | None = None) -> None:
        """Return once every record this writer wrote (up to `upto_seq`) is on stable storage."""
        self._acquire(self._sync_lock)
        try:
            if upto_seq is not None and self._durable_seq >= upto_seq:
                return
            self._acquire(self._lock)
            try:
                self._check_usable()
                try:
                    fd, target = os.dup(self._fd), self._chain.seq
                except OSError as exc:  # EMFILE, ENFILE: nothing synced, nothing claimed durable
                    raise AuditUnavailable(f"audit log not durable: no descriptor to sync it with: {exc}") from exc
            finally:
                self._lock.release()
            try:
                self._sync_dup(fd, target)
            except AuditUnavailable as exc:
                self._fail_and_give_back(self._failed or exc)
                raise
            with self._lock:
                self._unsynced = max(self._chain.seq - self._durable_seq, 0)
                self._last_sync_ns = self._clock()
        finally:
            self._sync_lock.release()

    def checkpoint(self) -> Receipt:
        with self._lock:
            self._check_usable()
            self._append_since = time.monotonic()
            try:
                self._take_lease()
                return self._write_checkpoint()
            except (OSError, records.RecordError) as exc:
                self._failed = exc
                raise AuditUnavailable(f"checkpoint not written: {exc}") from exc
            finally:
                self._append_since = 0.0
                self._lease.release()

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
                    self._take_lease()
                    self._write(records.WRITER_CLOSE, {"writer": self.writer_id, "pid": os.getpid()})
                    self._write_checkpoint()
            finally:
                self._lease.release()
                os.close(self._fd)
                self._fd = -1
                try:  # writers/ swapped for a symlink meanwhile: refused, the rest still closed
                    if self._registry_fd >= 0:
                        registry.unregister(self.directory, self.writer_id, self._registry_fd)
                finally:
                    self._lease.close()
                    self._head.close()

    def _release_all(self) -> None:
        """Close whatever a constructor that failed had opened, so that a caller retrying the open
        (the daemon does, every few seconds) does not run out of descriptors."""
        with contextlib.suppress(OSError):
            if self._registry_fd >= 0:
                registry.unregister(self.directory, self.writer_id, self._registry_fd)
        with contextlib.suppress(OSError):
            if self._fd >= 0:
                os.close(self._fd)
        self._fd = self._registry_fd = -1
        for part in ("_lease", "_head"):
            opened = getattr(self, part, None)
            if opened is not None:
                with contextlib.suppress(OSError):
                    opened.close()

    def __enter__(self) -> AuditWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- appending --------------------------------------------------------------------------------

    def _acquire(self, lock: threading.Lock) -> None:
        if not lock.acquire(timeout=self.settings.lock_wait_s):
            raise AuditStalled(f"audit log stalled: another write has not finished in {self.settings.lock_wait_s} s")

    def _check_usable(self) -> None:
        if self._failed is not None:
            raise AuditUnavailable(f"audit log failed earlier and is closed to writes: {self._failed}")
        if self._fd < 0:
            raise AuditUnavailable("audit log is closed")

    def _take_lease(self) -> None:
        """With a flusher thread the lease is kept across a burst of appends and given back at each
        group commit (so another writer waits at most about group_ms), which saves two syscalls per
        record; without one it is given back after every append."""
        if self._lease.take() and os.fstat(self._fd).st_size != self._size:
            self._load_tail()  # another writer appended or rotated since we last held it

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
        line, receipt = self._chain.line(kind, payload, None, None, priority, sig_fn)
        self._unsynced += 1
        self._since_checkpoint += 1
        self._put(line)
        return receipt

    def _put(self, data: bytes) -> None:
        """Write lines the chain has moved past: if this fails the writer is failed for good."""
        written = os.write(self._fd, data)
        while written < len(data):  # short writes are rare (signals, quotas) but must not tear a line
            written += os.write(self._fd, data[written:])
        self._size += len(data)

    # -- opening, rotating ------------------------------------------------------------------------

    def _open_latest(self) -> None:
        files = log_files(self.directory)
        if not files:
            self._chain.log_id = os.urandom(8).hex()
            self._switch_to(self.directory / log_name(1), create=True)
            self._write(
                records.LOG_OPEN,
                {
                    "log_id": self._chain.log_id,
                    "key_id": self._key_id,
                    "public_key": keys.b64url(keys.raw_public(self._key.public_key())),
                },
            )
            self.sync()
            return
        self._chain.log_id = logfiles.first_record(files[0]).get("payload", {}).get("log_id", "")
        self._switch_to(files[-1], create=False)
        self._load_tail()

    def _switch_to(self, path: Path, *, create: bool) -> None:
        fd = logfiles.open_log(path, create=create)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._file = fd, path
        self._size = os.fstat(fd).st_size
        started = None if create else logfiles.started_ns(path)
        self._file_started_ns = started if started is not None else self._clock()

    def _load_tail(self) -> None:
        """Take seq and hash from the last record; repair a torn line; follow a rotation marker."""
        while True:
            last, end, torn = read_tail(self._file)
            gap = logfiles.set_torn_aside(self.directory, self._file, self._fd, end, torn) if torn else None
            raw = last if last is not None else logfiles.previous_tail(self.directory, self._file)
            record = parse_line(raw)
            problem = records.check_line_hash(raw)
            if problem:
                raise records.RecordError(f"last record before {self._file.name}'s end does not verify ({problem})")
            self._chain.seq, self._chain.hash = record["seq"], record["hash"]
            self._size = os.fstat(self._fd).st_size
            if gap:
                self._write(records.GAP, gap, priority="high")
            if records.kind_of(record) != records.ROTATE or last is None:
                return
            next_file = self.directory / logfiles.rotation_target(record)
            # A crash after the rotate record but before the next file existed: the rotation is
            # finished here, in the file it named.
            self._switch_to(next_file, create=not next_file.exists())

    def _rotate(self) -> None:
        """Seal the current file, point it at the next one, and continue the chain there."""
        self._write_checkpoint()
        next_file = log_name(self._chain.seq + 2)  # the rotate record takes seq + 1
        self._write(records.ROTATE, {"next_file": next_file})
        self._sync_locked()
        self._switch_to(self.directory / next_file, create=True)

    # -- the registry -----------------------------------------------------------------------------

    def _register(self) -> None:
        self._registry_fd = registry.register(self.directory, self.writer_id, format_ts(self._clock()))
        self._write(
            records.WRITER_OPEN,
            {"writer": self.writer_id, "pid": os.getpid(), "uid": os.getuid(), "key_id": self._key_id},
        )

    def _reap_dead_writers(self) -> None:
        """A registry entry nobody holds belongs to a writer that stopped without closing: say so."""
        for dead in registry.dead_writers(self.directory):
            payload = {"reason": "writer_stopped_uncleanly", **dead, "last_seq_before_detection": self._chain.seq}
            self._write(records.GAP, payload, priority="high")
        os.fdatasync(self._fd)

    # -- group commit, checkpoints ----------------------------------------------------------------

    def _schedule_due(self) -> None:
        self._next_due_ns, self._due_seq, self._due_size = schedule.next_due(
            self.settings,
            now=self._chain.now,
            seq=self._chain.seq,
            unsynced=self._unsynced,
            last_sync_ns=self._last_sync_ns,
            since_checkpoint=self._since_checkpoint,
            last_checkpoint_ns=self._last_checkpoint_ns,
            file_started_ns=self._file_started_ns,
            flusher_busy=self._group_for_flusher is not None,
        )

    def _maybe_group_commit(self) -> None:
        now = self._chain.now
        if not schedule.group_commit_due(
            self.settings, now=now, unsynced=self._unsynced, last_sync_ns=self._last_sync_ns
        ):
            return
        if self._flusher is None:
            self._sync_locked()
        elif self._group_for_flusher is None:
            # Hand the group over instead of letting the flusher take self._lock: under a stream of
            # appends a waiting flusher was woken (and lost the lock again) at every append's release.
            self._group_for_flusher = (os.dup(self._fd), self._chain.seq)
            self._unsynced, self._last_sync_ns = 0, now
            self._lease.release()  # other writers get their turn once per group
            self._flush_wanted.set()

    def _sync_locked(self) -> None:
        """fdatasync on the append path (caller holds the locks)."""
        os.fdatasync(self._fd)
        self._durable_seq, self._unsynced, self._last_sync_ns = self._chain.seq, 0, self._clock()

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

    def _maybe_checkpoint_and_rotate(self) -> None:
        now, settings = self._chain.now, self.settings
        if schedule.checkpoint_due(
            settings, now=now, since_checkpoint=self._since_checkpoint, last_checkpoint_ns=self._last_checkpoint_ns
        ):
            self._write_checkpoint(head_later=self._flusher is not None)
        if schedule.rotation_due(settings, now=now, size=self._size, file_started_ns=self._file_started_ns):
            self._rotate()

    def _write_checkpoint(self, *, head_later: bool = False) -> Receipt:
        """A checkpoint record sealing the chain so far, then HEAD.json naming it. HEAD may only
        name a durable record: with `head_later` the flusher thread writes it after its next
        fdatasync, which keeps two fsyncs off the append path."""
        if not (self.directory / HEAD_FILE).exists():
            # verify takes a log with a checkpoint and no HEAD for one cut back after its HEAD was
            # removed. So no checkpoint is written before a HEAD exists: the first one names the
            # last record before the checkpoint, and a crash before the checkpoint's own HEAD leaves
            # a log that verifies.
            if logfiles.has_checkpoint(self.directory):
                # Sealed before, so HEAD was removed (or lost by an older writer's crash): the HEAD
                # written now would make a log cut back before it look whole. The chain says so.
                payload = {"reason": "head_missing", "last_seq_before_detection": self._chain.seq}
                self._write(records.GAP, payload, priority="high")
            self._sync_locked()
            self._head.write(Receipt(self._chain.seq, self._chain.hash, self._chain.log_id))
        receipt = self._write(records.CHECKPOINT, checkpoint_payload(self._chain.seq, self._key_id), sig_fn=self._sign)
        self._since_checkpoint, self._last_checkpoint_ns = 0, self._clock()
        if head_later:
            self._pending_head = receipt
            self._flush_wanted.set()
        else:
            self._sync_locked()
            self._pending_head = None
            self._head.write(receipt)
        return receipt

    # -- the flusher thread -----------------------------------------------------------------------

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
            try:
                group = handed or self._idle_group()
            except OSError as exc:  # no descriptor to sync with: appends must see the writer failed
                self._fail_and_give_back(exc)
                return
            if group is not None:
                try:
                    with self._sync_lock:
                        self._sync_dup(*group)
                except AuditUnavailable as exc:
                    self._fail_and_give_back(self._failed or exc)
                    return
                finally:
                    if handed is not None:
                        self._group_for_flusher = None  # only the flusher empties the slot, appends fill it
                        self._next_due_ns = 0  # the next append hands over what gathered meanwhile
            head = self._pending_head
            if head is not None and self._durable_seq >= head.seq:
                try:
                    self._head.write(head)
                except OSError as exc:
                    self._fail_and_give_back(exc)
                    return
                if self._pending_head is head:
                    self._pending_head = None

    def _fail_and_give_back(self, exc: Exception) -> None:
        """Fail the writer (from the flusher, or a sync outside the lock) and give the append lease
        back: every other writer on the log waits for it, and a failed writer appends nothing more.
        Waits for the lock: an append holding it may have looked at the failure before it was set,
        and would keep the lease. Safe from both callers: neither holds the lock, and no holder of
        the lock waits for _sync_lock. An append stalled past lock_wait_s keeps it until close()."""
        self._failed = exc
        if self._lock.acquire(timeout=self.settings.lock_wait_s):
            try:
                self._lease.release()
            finally:
                self._lock.release()

    def _idle_group(self) -> tuple[int, int] | None:
        """When appends have paused: the unsynced tail, and the flock lease given back so other
        writers are not kept out by an idle one. Never waits for the lock: if an append holds it,
        appends are going on and will hand over their group and the lease themselves."""
        if not (self._unsynced or self._lease.held) or not self._lock.acquire(blocking=False):
            return None
        try:
            group = None
            if self._fd >= 0 and self._unsynced:
                group = (os.dup(self._fd), self._chain.seq)
                self._unsynced, self._last_sync_ns = 0, self._clock()
            self._lease.release()
            return group
        finally:
            self._lock.release()
