"""The audit writer out of process resources: no descriptor left (EMFILE) or no thread to start.
Every failure comes as the appender's AuditUnavailable (the caller denies what it was recording),
nothing is claimed durable that was not synced, and a writer that cannot open leaves no descriptor."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, WriterSettings, records
from enforcer.audit.verify import verify_directory

from ..helpers.audit_exhaustion import fail_the_flusher, no_descriptor_left


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_sync_with_no_descriptor_left_is_audit_unavailable_and_claims_nothing(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit", tmp_path / "k.pem")
    try:
        receipt = writer.append(records.DECISION, {"decision": "allow"})
        assert writer.durable_seq < receipt.seq
        with no_descriptor_left():
            with pytest.raises(AuditUnavailable, match="Too many open files"):
                writer.sync()
            with pytest.raises(AuditUnavailable, match="Too many open files"):
                writer.append(records.DECISION, {"decision": "deny"}, sync=True)
        assert writer.durable_seq < receipt.seq, "nothing may be called durable that was not synced"
        writer.sync()  # descriptors are back: the records written meanwhile become durable
        assert writer.durable_seq == receipt.seq + 1
    finally:
        writer.close()
    assert verify_directory(tmp_path / "audit").intact


def test_a_flusher_with_no_descriptor_left_fails_the_writer_instead_of_dying_unseen(tmp_path: Path) -> None:
    """The flusher thread syncs what idle appends left: an OSError there ended the thread, and the
    writer went on taking appends that no thread would ever make durable."""
    writer = AuditWriter(
        tmp_path / "audit", tmp_path / "k.pem", settings=WriterSettings(background_flush=True, group_ms=300)
    )
    try:
        fail_the_flusher(writer)
        assert writer._flusher is not None and not writer._flusher.is_alive()
        with pytest.raises(AuditUnavailable, match="failed earlier"):
            writer.append(records.DECISION, {"decision": "deny"})
    finally:
        writer.close()


def test_a_writer_whose_flusher_cannot_start_closes_what_it_opened(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    AuditWriter(directory, key).close()  # the log and key exist: only the failing writer's own descriptors remain
    before = _open_fds()

    def no_thread(self: threading.Thread, *args: Any) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", no_thread)
    with pytest.raises(AuditUnavailable, match=r"flusher thread did not start \(can't start new thread\)"):
        AuditWriter(directory, key, settings=WriterSettings(background_flush=True))
    monkeypatch.undo()
    assert _open_fds() == before, "every descriptor the writer opened is closed"
    assert not list((directory / "writers").iterdir()), "no registry entry is left to be reported dead"
    report = verify_directory(directory)
    assert report.intact and not report.gaps, report


def test_a_writer_that_cannot_register_closes_what_it_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    AuditWriter(directory, key).close()
    before = _open_fds()
    from enforcer.audit import registry

    def refused(*args: Any) -> int:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(registry, "register", refused)
    with pytest.raises(AuditUnavailable, match="Permission denied"):
        AuditWriter(directory, key)
    assert _open_fds() == before
