"""Audit logs written and verified the way the tests of the audit log need them
(tests/unit/test_audit_log.py, tests/attacks/test_audit_*.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from enforcer.audit import AuditWriter, WriterSettings, records
from enforcer.cli.audit import main as audit_main


def make_log(tmp_path: Path, count: int = 30, **settings: object) -> tuple[Path, Path]:
    """A log of `count` decisions in tmp_path/audit, written with `settings`: (its directory, its key)."""
    directory, key = tmp_path / "audit", tmp_path / "key" / "audit.pem"
    with AuditWriter(directory, key, settings=WriterSettings(**settings)) as writer:  # type: ignore[arg-type]
        for i in range(count):
            writer.append(records.DECISION, {"agent": "urn:a", "decision": "deny" if i % 3 else "allow", "n": i})
    return directory, key


def verify_cli(directory: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    """`adl-audit --dir directory verify *extra`: (its exit code, what it printed)."""
    code = audit_main(["--dir", str(directory), "verify", *extra])
    captured = capsys.readouterr()
    return code, captured.out + captured.err
