"""The daemon's audit writer and its health.

When an append fails the sink reports unhealthy (health NOT_SERVING, Check answers UNAVAILABLE) and
the main loop reopens the log every few seconds; the first record after recovery is a gap record
naming the failure, so the chain shows that decisions in between were refused, not lost.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from ..audit import AuditUnavailable, AuditWriter, Entry, Receipt, WriterSettings, records
from ..audit.writer import Appender


class AuditSink(Appender):
    def __init__(
        self,
        directory: Path,
        key: Path,
        settings: WriterSettings,
        on_change: Callable[[bool], None],
        retry_s: float = 1.0,
    ) -> None:
        self.directory, self.key, self.settings = directory, key, settings
        self._on_change = on_change
        self._retry_s = retry_s
        self._writer: AuditWriter | None = None
        self._error: str | None = "not opened"
        self._failed_at = 0.0
        self._lock = threading.Lock()

    @property
    def healthy(self) -> bool:
        return self._error is None

    @property
    def error(self) -> str | None:
        return self._error

    @property
    def log_id(self) -> str:
        return self._writer.log_id if self._writer else ""

    def open(self) -> None:
        self._writer = AuditWriter(self.directory, self.key, source="adl-enforcerd", settings=self.settings)
        self._set(None)

    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        """AuditWriter.append_many, with the sink's health kept."""
        writer = self._writer
        if writer is None or self._error is not None:
            raise AuditUnavailable(self._error or "audit log not open")
        try:
            return writer.append_many(entries, sync=sync)
        except AuditUnavailable as exc:
            self._fail(str(exc))
            raise

    def sync(self) -> None:
        if self._writer is not None and self._error is None:
            try:
                self._writer.sync()
            except AuditUnavailable as exc:
                self._fail(str(exc))
                raise

    def tick(self) -> None:
        """Notice a failure the flusher found; reopen a failed log when it is time."""
        writer = self._writer
        if self._error is None and writer is not None and writer.failed is not None:
            self._fail(f"audit log failed: {writer.failed}")
        if self._error is None or time.monotonic() - self._failed_at < self._retry_s:
            return
        with self._lock:
            error = self._error
            self._failed_at = time.monotonic()
            if self._writer is not None:
                with contextlib.suppress(Exception):
                    self._writer.close()
                self._writer = None
            try:
                writer = AuditWriter(self.directory, self.key, source="adl-enforcerd", settings=self.settings)
                writer.append(records.GAP, {"reason": "audit_write_failed", "error": error}, priority="high", sync=True)
            except AuditUnavailable as exc:
                self._error = str(exc)
                return
            self._writer = writer
        self._set(None)

    def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(AuditUnavailable, OSError):
                self._writer.close()
            self._writer = None

    def _fail(self, error: str) -> None:
        if self._error is None:
            self._failed_at = time.monotonic()
            self._set(error)

    def _set(self, error: str | None) -> None:
        self._error = error
        self._on_change(error is None)
