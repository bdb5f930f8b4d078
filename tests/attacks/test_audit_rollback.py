"""Someone who can write the audit directory, without the sealing key, rolls the log back: cuts it
back to an older checkpoint and puts back the HEAD.json of that time (readable to them like the rest
of the directory), or replaces the whole log with one sealed by a key of their own. On the host alone
the rollback verifies (the threat model says so); against a HEAD.json the auditor saved elsewhere
after that checkpoint (`adl-audit verify --anchor`) it must not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from enforcer.audit import AuditWriter, WriterSettings, records
from enforcer.audit.writer import log_files

from ..helpers.audit_logs import verify_cli

SETTINGS = WriterSettings(checkpoint_records=10)


def _write(directory: Path, key: Path, first: int, count: int) -> None:
    with AuditWriter(directory, key, settings=SETTINGS) as writer:
        for n in range(first, first + count):
            writer.append(records.DECISION, {"agent": "urn:a", "decision": "deny", "n": n})


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, Path, Path, Path, bytes]:
    """A log written in two sittings, with the HEAD.json saved after each (off the host, say), and
    the log's bytes after the first."""
    directory, key = tmp_path / "audit", tmp_path / "key" / "audit.pem"
    _write(directory, key, 0, 25)
    assert len(log_files(directory)) == 1
    first_bytes = log_files(directory)[0].read_bytes()
    saved_then = tmp_path / "offhost" / "HEAD-then.json"
    saved_then.parent.mkdir()
    shutil.copy(directory / "HEAD.json", saved_then)
    _write(directory, key, 25, 25)
    saved_now = tmp_path / "offhost" / "HEAD-now.json"
    shutil.copy(directory / "HEAD.json", saved_now)
    return directory, key, saved_then, saved_now, first_bytes


def test_a_log_rolled_back_with_its_old_head_fails_against_a_newer_saved_head(
    history: tuple[Path, Path, Path, Path, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, saved_then, saved_now, first_bytes = history
    assert verify_cli(directory, capsys, "--anchor", str(saved_now))[0] == 0
    # The rollback: the log as it was after the first sitting, and that time's HEAD.json.
    log_files(directory)[0].write_bytes(first_bytes)
    shutil.copy(saved_then, directory / "HEAD.json")
    code, out = verify_cli(directory, capsys)
    assert code == 0, out  # the directory alone cannot show it
    code, out = verify_cli(directory, capsys, "--anchor", str(saved_then), "--anchor", str(saved_now))
    assert code == 2, out
    now_seq = json.loads(saved_now.read_text())["seq"]
    assert f"says seq {now_seq} was written" in out and "rolled back" in out


def test_a_replaced_log_sealed_with_another_key_fails_against_a_saved_head(
    history: tuple[Path, Path, Path, Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, _, saved_now, _ = history
    shutil.rmtree(directory)
    _write(directory, tmp_path / "their-key" / "audit.pem", 0, 60)  # longer than the original
    assert verify_cli(directory, capsys)[0] == 0
    code, out = verify_cli(directory, capsys, "--anchor", str(saved_now))
    assert code == 2, out
    assert "signature does not verify with the sealing key" in out


def test_a_record_rewritten_at_the_saved_seq_is_named(
    history: tuple[Path, Path, Path, Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A saved head whose seq the log holds, but whose hash names another record: the head belongs to
    another log sealed with the same key (one directory's copy checked against another's)."""
    _, key, _, saved_now, _ = history
    other = tmp_path / "other"
    _write(other, key, 100, 80)
    code, out = verify_cli(other, capsys, "--anchor", str(saved_now))
    assert code == 2, out
    seq = json.loads(saved_now.read_text())["seq"]
    assert f"seq {seq} is not the record the saved head" in out


def test_an_unreadable_saved_head_is_a_usage_error_not_a_verdict(
    history: tuple[Path, Path, Path, Path, bytes], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = history[0]
    for i, content in enumerate(
        [b"{", b"[]", b'{"seq": 0, "hash": "", "sig": ""}', b'{"seq": true, "hash": "", "sig": ""}']
    ):
        bad = tmp_path / f"bad{i}.json"
        bad.write_bytes(content)
        code, out = verify_cli(directory, capsys, "--anchor", str(bad))
        assert code == 2 and "cannot read the saved head" in out and "TAMPERED" not in out, (content, out)
    code, out = verify_cli(directory, capsys, "--anchor", str(tmp_path / "missing.json"))
    assert code == 2 and "cannot read the saved head" in out


def test_saved_heads_that_hold_are_counted(
    history: tuple[Path, Path, Path, Path, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    directory, _, saved_then, saved_now, _ = history
    code, out = verify_cli(directory, capsys, "--anchor", str(saved_then), "--anchor", str(saved_now))
    assert code == 0 and "saved heads: 2 of 2 hold" in out and "intact" in out, out
    code, out = verify_cli(directory, capsys, "--json", "--anchor", str(saved_now))
    assert code == 0 and json.loads(out)["anchors_checked"] == 1


def test_an_older_head_put_back_is_named_before_it_is_saved(
    history: tuple[Path, Path, Path, Path, bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy is only as new as the HEAD.json it was taken from, and whoever can write the directory
    can put an older signed one back while the log stays whole: the directory then verifies, and a
    copy saved from it guards nothing after the older checkpoint (the rollback below passes against
    it). verify says so, so the auditor saves the copy once a writer has moved HEAD."""
    directory, _, saved_then, saved_now, first_bytes = history
    code, out = verify_cli(directory, capsys)
    assert code == 0 and "HEAD.json names seq" not in out, out  # as the writer left it
    shutil.copy(saved_then, directory / "HEAD.json")
    then_seq = json.loads(saved_then.read_text())["seq"]
    now_seq = json.loads(saved_now.read_text())["seq"]
    code, out = verify_cli(directory, capsys)
    assert code == 0, out  # a HEAD that lags the newest checkpoint is what a crashed writer leaves too
    assert f"HEAD.json names seq {then_seq}, the log is sealed through seq {now_seq}" in out, out
    stale = directory.parent / "offhost" / "HEAD-stale.json"
    shutil.copy(directory / "HEAD.json", stale)
    log_files(directory)[0].write_bytes(first_bytes)
    code, out = verify_cli(directory, capsys, "--anchor", str(stale))
    assert code == 0, out  # the stale copy cannot show the rollback: hence the warning above
    code, out = verify_cli(directory, capsys, "--json")
    assert json.loads(out)["head_seq"] == then_seq
