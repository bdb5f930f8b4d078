"""The daemon's audit sink: a failed log is reopened by the main loop's tick, whatever stops it."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import AuditUnavailable, WriterSettings, records
from enforcer.daemon import auditsink
from enforcer.daemon.auditsink import AuditSink


def test_a_reopen_with_no_thread_to_start_is_retried_and_the_tick_survives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer starts its flusher thread when it opens; out of tasks that raises RuntimeError,
    which ended the daemon's main loop (and with it reloads, approval expiry and the watchdog)."""
    health: list[bool] = []
    sink = AuditSink(tmp_path / "audit", tmp_path / "key.pem", WriterSettings(), health.append, retry_s=0)
    sink.open()
    try:
        sink._fail("the disk went away")
        real = auditsink.AuditWriter

        def no_thread(*args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("can't start new thread")

        monkeypatch.setattr(auditsink, "AuditWriter", no_thread)
        sink.tick()
        assert not sink.healthy and "can't start new thread" in (sink.error or "")
        with pytest.raises(AuditUnavailable):
            sink.append(records.DECISION, {"decision": "allow"})
        monkeypatch.setattr(auditsink, "AuditWriter", real)
        sink.tick()
        assert sink.healthy and health[-1] is True
        sink.append(records.DECISION, {"decision": "allow"})
    finally:
        sink.close()


def test_no_descriptor_left_fails_the_log_and_its_reopen_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of descriptors the writer's sync raised a bare OSError (EMFILE): the daemon's main loop,
    reopening the log, ended with it and the daemon exited."""
    sink = AuditSink(tmp_path / "audit", tmp_path / "key.pem", WriterSettings(), lambda ok: None, retry_s=0)
    sink.open()
    try:
        emfile = OSError(errno.EMFILE, "Too many open files")

        def no_descriptor(*args: Any, **kwargs: Any) -> Any:
            raise emfile

        assert sink._writer is not None
        monkeypatch.setattr(sink._writer, "append_many", no_descriptor)
        with pytest.raises(AuditUnavailable, match="Too many open files"):
            sink.append(records.DECISION, {"decision": "allow"})
        assert not sink.healthy, "a log that cannot write is failed: Checks get UNAVAILABLE, health says so"
        monkeypatch.setattr(auditsink.AuditWriter, "append_many", no_descriptor)
        sink.tick()  # the reopen's GAP record fails the same way: retried, never raised
        assert not sink.healthy
        monkeypatch.undo()
        sink.tick()
        assert sink.healthy
        sink.append(records.DECISION, {"decision": "allow"})
    finally:
        sink.close()
