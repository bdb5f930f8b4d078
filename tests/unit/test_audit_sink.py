"""The daemon's audit sink: a failed log is reopened by the main loop's tick, whatever stops it."""

from __future__ import annotations

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
