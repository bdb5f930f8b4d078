"""A writer that failed must not keep the append lease: every writer on the log (the daemon's, each
session's supervisor's and egress filter's) waits for it, so a daemon writer failed out of
descriptors would hold every session's audit records, and the sessions with them, until the
daemon closes it."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, WriterSettings, records
from enforcer.audit.registry import APPEND_LOCK

from ..helpers.audit_exhaustion import fail_the_flusher


def _lease_free(directory: Path) -> bool:
    fd = os.open(directory / APPEND_LOCK, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # the flock goes with its only descriptor
    return True


def _sync_fails(
    writer: AuditWriter, directory: Path, monkeypatch: pytest.MonkeyPatch, failing: Callable[[int], None]
) -> None:
    """Append, with the lease then kept between appends for the flusher, and have the caller's
    sync fail in fdatasync (`failing`)."""
    writer.append(records.DECISION, {"decision": "allow"})
    assert not _lease_free(directory)  # kept for the next append while the flusher runs
    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(AuditUnavailable, match="Input/output error"):
        writer.sync()
    monkeypatch.undo()


def test_a_writer_whose_flusher_failed_gives_the_lease_back(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    writer = AuditWriter(directory, tmp_path / "k.pem", settings=WriterSettings(background_flush=True, group_ms=300))
    try:
        fail_the_flusher(writer)
        with pytest.raises(AuditUnavailable, match="failed earlier"):
            writer.append(records.DECISION, {"decision": "deny"})
        assert _lease_free(directory), "the failed writer still holds the append lease"
    finally:
        writer.close()


def test_a_writer_whose_sync_failed_gives_the_lease_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fdatasync failing (EIO from a failing disk) in a caller's sync, with the lease kept between
    appends for the flusher."""
    directory = tmp_path / "audit"
    writer = AuditWriter(directory, tmp_path / "k.pem", settings=WriterSettings(background_flush=True, group_ms=1000))

    def failing(fd: int) -> None:
        raise OSError(5, "Input/output error")

    try:
        _sync_fails(writer, directory, monkeypatch, failing)
        assert isinstance(writer.failed, OSError)
        assert _lease_free(directory), "the failed writer still holds the append lease"
    finally:
        writer.close()


def test_a_sync_failing_while_an_append_holds_the_lock_still_gives_the_lease_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync fails outside the writer's lock while another thread holds it (an append finishing,
    past its own look at the failure): the lease must still be given back once that thread lets
    the lock go, not kept until the writer is closed."""
    directory = tmp_path / "audit"
    writer = AuditWriter(directory, tmp_path / "k.pem", settings=WriterSettings(background_flush=True, group_ms=10_000))
    held = threading.Event()

    def hold_the_lock() -> None:
        with writer._lock:
            held.set()
            time.sleep(0.3)

    holder = threading.Thread(target=hold_the_lock)

    def failing(fd: int) -> None:
        holder.start()  # the lock is taken between the sync's copy of the descriptor and its failure
        assert held.wait(5)
        raise OSError(5, "Input/output error")

    try:
        _sync_fails(writer, directory, monkeypatch, failing)
        holder.join()
        assert isinstance(writer.failed, OSError)
        assert _lease_free(directory), "the failed writer still holds the append lease"
    finally:
        writer.close()
