"""AEE §11.1 and §7 for audit records: ids unique and lexicographically sortable, `kid` in signatures."""

from __future__ import annotations

from pathlib import Path

import orjson

from enforcer.audit import AuditWriter, WriterSettings, records
from enforcer.audit.writer import log_files


def _records(directory: Path) -> list[dict]:  # type: ignore[type-arg]
    return [orjson.loads(line) for path in log_files(directory) for line in path.read_bytes().splitlines()]


def test_ids_sort_in_record_order_and_are_unique(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    settings = WriterSettings(checkpoint_records=7, rotate_bytes=4096)
    with AuditWriter(directory, tmp_path / "audit.pem", settings=settings) as writer:
        for n in range(120):  # past seq 9, 99 and a few rotations
            writer.append(records.DECISION, {"n": n})
    found = _records(directory)
    assert len(log_files(directory)) > 1 and len(found) > 100
    ids = [r["id"] for r in found]
    assert len(set(ids)) == len(ids)
    assert ids == sorted(ids)  # '<log>.10' once sorted before '<log>.9'
    assert [r["seq"] for r in found] == sorted(r["seq"] for r in found)


def test_record_signatures_name_their_key_with_kid(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    with AuditWriter(directory, tmp_path / "audit.pem", settings=WriterSettings(checkpoint_records=5)) as writer:
        for n in range(12):
            writer.append(records.DECISION, {"n": n})
    signed = [r for r in _records(directory) if isinstance(r.get("sig"), dict)]
    assert signed
    for record in signed:
        assert set(record["sig"]) == {"alg", "kid", "value"}
        assert record["sig"]["kid"] == record["payload"]["key_id"]
