"""Someone who can write the audit directory but does not hold the sealing key edits the log after
the fact: every change that removes or alters sealed records must make `adl-audit verify` fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from enforcer.audit import AuditWriter, WriterSettings, records
from enforcer.audit.writer import log_files
from enforcer.cli.audit import main as audit_main


def _sealed_log(tmp_path: Path) -> Path:
    directory = tmp_path / "audit"
    with AuditWriter(directory, tmp_path / "key" / "audit.pem", settings=WriterSettings(checkpoint_records=15)) as w:
        for i in range(60):
            w.append(records.DECISION, {"agent": "urn:a", "decision": "deny", "n": i})
    return directory


def _verify(directory: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = audit_main(["--dir", str(directory), "verify"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_cutting_the_log_back_to_a_checkpoint_and_removing_head_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _sealed_log(tmp_path)
    assert _verify(directory, capsys)[0] == 0
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    checkpoints = [i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line]
    kept = checkpoints[1] + 1  # every record after the second checkpoint goes, writer.close included
    path.write_bytes(b"".join(lines[:kept]))
    (directory / "HEAD.json").unlink()
    code, out = _verify(directory, capsys)
    assert code == 2, out
    assert f"TAMPERED at seq {kept + 1}: HEAD.json is missing" in out


def test_a_log_never_sealed_needs_no_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _sealed_log(tmp_path)
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    first_checkpoint = next(i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line)
    path.write_bytes(b"".join(lines[:first_checkpoint]))
    (directory / "HEAD.json").unlink()
    code, out = _verify(directory, capsys)
    assert code == 0, out
    assert "unsealed:" in out


def test_a_file_name_chosen_by_the_tamperer_reaches_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _sealed_log(tmp_path)
    (directory / "audit-\x1b]0;owned\x07\x1b[2J.jsonl").write_bytes(b"")
    code, out = _verify(directory, capsys)
    assert code == 2, out
    assert "TAMPERED at seq 1:" in out and "\\x1b]0;owned" in out
    assert "\x1b" not in out and "\x07" not in out
