"""The daemon's audit writer and its health.

When an append fails the sink reports unhealthy (health NOT_SERVING, Check answers UNAVAILABLE) and
the main loop reopens the log every few seconds; the first record after recovery is a gap record
naming the failure, so the chain shows that decisions in between were refused, not lost. A record
the writer refuses for its content (RecordRejected) fails its own request only: the log is fine.

A log that stops making progress (a write, fdatasync or HEAD update that has not returned within
`write_deadline_s`: a frozen or hung filesystem) is unhealthy too, for as long as it lasts; appends
then fail at once instead of queueing behind the stuck one. Nothing is reopened for a stall: the
stuck call still holds the writer, and when it returns the log simply goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..audit import AuditUnavailable, AuditWriter, Entry, Receipt, WriterSettings, records
from ..audit.writer import Appender, AuditStalled, RecordRejected

log = logging.getLogger(__name__)


class AuditSink(Appender):
    def __init__(
        self,
        directory: Path,
        key: Path,
        settings: WriterSettings,
        on_change: Callable[[bool], None],
        retry_s: float = 1.0,
        write_deadline_s: float = 10.0,
    ) -> None:
        self.directory, self.key = directory, key
        self.settings = dataclasses.replace(settings, lock_wait_s=write_deadline_s)
        self._on_change = on_change
        self._retry_s = retry_s
        self._deadline_s = write_deadline_s
        self._writer: AuditWriter | None = None
        self._error: str | None = "not opened"
        self._stalled: str | None = None
        self._failed_at = 0.0
        self._lock = threading.Lock()

    @property
    def healthy(self) -> bool:
        return self._error is None and self._stalled is None

    @property
    def stalled(self) -> bool:
        return self._stalled is not None

    @property
    def error(self) -> str | None:
        return self._error or self._stalled

    @property
    def log_id(self) -> str:
        return self._writer.log_id if self._writer else ""

    def open(self) -> None:
        self._writer = AuditWriter(self.directory, self.key, source="adl-enforcerd", settings=self.settings)
        self._set(None)

    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        """AuditWriter.append_many, with the sink's health kept."""
        writer = self._writer
        if writer is None or self._error is not None or self._stalled is not None:
            raise AuditUnavailable(self._error or self._stalled or "audit log not open")
        try:
            return writer.append_many(entries, sync=sync)
        except (RecordRejected, AuditStalled):  # the entry's fault, or a stall tick() reports: the log is not failed
            raise
        except AuditUnavailable as exc:
            self._fail(str(exc))
            raise
        except OSError as exc:  # one the writer did not wrap as AuditUnavailable: failed all the same
            self._fail(f"audit log failed: {exc}")
            raise AuditUnavailable(f"audit log failed: {exc}") from exc

    def sync(self) -> None:
        writer = self._writer
        if writer is not None and self._error is None:
            try:
                writer.sync()
            except AuditStalled:
                raise
            except AuditUnavailable as exc:
                self._fail(str(exc))
                raise
            except OSError as exc:
                self._fail(f"audit log failed: {exc}")
                raise AuditUnavailable(f"audit log failed: {exc}") from exc

    def tick(self) -> None:
        """Notice a stall, or a failure the flusher found; reopen a failed log when it is time."""
        writer = self._writer
        self._check_progress(writer)
        if self._error is None and writer is not None and writer.failed is not None:
            self._fail(f"audit log failed: {writer.failed}")
        if self._error is None or self._stalled or time.monotonic() - self._failed_at < self._retry_s:
            return  # a stalled writer is not closed: the stuck call holds it
        with self._lock:
            error = self._error
            self._failed_at = time.monotonic()
            if self._writer is not None:
                with contextlib.suppress(Exception):
                    self._writer.close()
                self._writer = None
            writer = None
            try:
                writer = AuditWriter(self.directory, self.key, source="adl-enforcerd", settings=self.settings)
                writer.append(records.GAP, {"reason": "audit_write_failed", "error": error}, priority="high", sync=True)
            except (AuditUnavailable, RuntimeError, OSError) as exc:  # RuntimeError: no thread for its flusher
                if writer is not None:  # never keep its descriptors while the log stays failed
                    with contextlib.suppress(Exception):
                        writer.close()
                self._error = str(exc) if isinstance(exc, AuditUnavailable) else f"audit log not reopened: {exc}"
                return
            self._writer = writer
        self._set(None)

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(AuditUnavailable, OSError):
                self._writer.close()
            self._writer = None

    def _check_progress(self, writer: AuditWriter | None) -> None:
        stuck_s = writer.stalled_s() if writer is not None else 0.0
        if stuck_s > self._deadline_s:
            if self._stalled is None:
                self._stalled = (
                    f"audit log stalled: a write to {self.directory} has not returned for {stuck_s:.1f} s "
                    f"(write_deadline_s {self._deadline_s:g})"
                )
                log.error("%s", self._stalled)
                self._on_change(False)
        elif self._stalled is not None:
            log.warning("audit log writes are returning again after a stall")
            self._stalled = None
            self._on_change(self.healthy)

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._failed_at = time.monotonic()
            self._set(error)

    def _set(self, error: str | None) -> None:
        self._error = error
        self._on_change(error is None)
