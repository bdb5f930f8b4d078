"""The chained audit writer and `adl-audit verify`: every tampering is caught and named."""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, Entry, WriterSettings, records
from enforcer.audit.verify import verify_directory
from enforcer.audit.writer import AuditStalled, RecordRejected, log_files

from ..helpers.audit_logs import make_log, verify_cli


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_chain_is_gap_free_and_sealed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory, key = make_log(tmp_path)
    seqs = [orjson.loads(line)["seq"] for line in lines_of(log_files(directory)[0])]
    assert seqs == list(range(1, len(seqs) + 1))
    first = orjson.loads(lines_of(log_files(directory)[0])[0])
    assert set(first) >= {"v", "id", "ts", "type", "from", "to", "intent", "corr", "reply_to", "trace", "priority"}
    assert first["type"] == "event" and records.kind_of(first) == records.LOG_OPEN
    assert len(first["ts"].split(".")[1]) == 10  # nine digits and Z
    code, out = verify_cli(directory, capsys, "--public-key", str(key))
    assert code == 0, out
    assert "intact" in out and "unsealed" not in out
    # the key is also accepted as the .pub.pem written beside it
    assert verify_cli(directory, capsys, "--public-key", str(key.with_name("audit.pub.pem")))[0] == 0


def _eventually(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Whether `condition` holds within `timeout_s`: for what a background thread does a moment later."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_background_flusher_syncs_handed_groups_and_the_idle_tail(tmp_path: Path) -> None:
    fds_before = len(os.listdir("/proc/self/fd"))
    settings = WriterSettings(background_flush=True, group_records=8, group_ms=50.0, checkpoint_records=20)
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", settings=settings)
    receipts = [writer.append(records.DECISION, {"n": n}) for n in range(101)]
    # The flusher makes the tail durable, then writes HEAD a moment later: wait for each in turn.
    assert _eventually(lambda: writer.durable_seq >= receipts[-1].seq)  # the tail after the last full group
    head_path = tmp_path / "log" / "HEAD.json"

    def head_seq() -> int:
        return orjson.loads(head_path.read_bytes())["seq"] if head_path.exists() else 0

    # HEAD names a recent checkpoint once it is durable
    assert _eventually(lambda: head_seq() > receipts[-1].seq - 20), (head_seq(), receipts[-1].seq)
    writer.close()
    assert len(os.listdir("/proc/self/fd")) == fds_before  # no duplicate descriptor left behind
    assert verify_directory(tmp_path / "log").intact


def test_an_idle_writer_lets_another_writer_in(tmp_path: Path) -> None:
    settings = WriterSettings(background_flush=True, group_ms=20.0)
    first = AuditWriter(tmp_path / "log", tmp_path / "key.pem", settings=settings)
    first.append(records.DECISION, {"n": 1}, sync=True)  # leaves nothing unsynced, lease still held
    opened: list[AuditWriter] = []
    opener = threading.Thread(target=lambda: opened.append(AuditWriter(tmp_path / "log", tmp_path / "key.pem")))
    opener.start()
    opener.join(timeout=3)  # it waits for the flock lease the idle first writer must give back
    if not opened:
        first.close()  # lets the opener finish, so the failure leaves no thread behind
        opener.join()
        opened[0].close()
        pytest.fail("an idle writer kept its flock lease: a second writer could not open the log")
    second = opened[0]
    second.append(records.DECISION, {"n": 2})
    first.append(records.DECISION, {"n": 3})
    second.close()
    first.close()
    assert verify_directory(tmp_path / "log").intact


def test_reopen_continues_the_chain(tmp_path: Path) -> None:
    directory, key = make_log(tmp_path, 5)
    with AuditWriter(directory, key) as writer:
        receipt = writer.append(records.DECISION, {"decision": "allow"})
    assert receipt.seq > 5
    report = verify_directory(directory)
    assert report.intact and not report.gaps and report.last_seq > receipt.seq


def _edit_field(directory: Path) -> int:
    path = log_files(directory)[0]
    lines = lines_of(path)
    lines[10] = lines[10].replace(b'"decision":"deny"', b'"decision":"allow"')
    path.write_bytes(b"".join(lines))
    return orjson.loads(lines[10])["seq"]


def _delete_line(directory: Path) -> int:
    path = log_files(directory)[0]
    lines = lines_of(path)
    del lines[7]
    path.write_bytes(b"".join(lines))
    return 8


def _reorder(directory: Path) -> int:
    path = log_files(directory)[0]
    lines = lines_of(path)
    lines[12], lines[13] = lines[13], lines[12]
    path.write_bytes(b"".join(lines))
    return 13


def _truncate_mid_line(directory: Path) -> int:
    path = log_files(directory)[0]
    lines = lines_of(path)
    path.write_bytes(b"".join(lines[:20]) + lines[20][:40])
    return 21


def _truncate_whole_lines(directory: Path) -> int:
    path = log_files(directory)[0]
    path.write_bytes(b"".join(lines_of(path)[:20]))
    return 21


def _edit_checkpoint_signature(directory: Path) -> int:
    path = log_files(directory)[-1]
    lines = lines_of(path)
    index = next(i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line)
    record = orjson.loads(lines[index])
    record["sig"]["value"] = record["sig"]["value"][::-1]
    del record["hash"]
    body = records.canonical(record)  # re-hash so only the signature can catch it
    lines[index] = records.with_hash(body, hashlib.sha256(body).hexdigest())
    path.write_bytes(b"".join(lines))
    return record["seq"]


def _rehash_edited_record(directory: Path) -> int:
    """An attacker who edits a record and recomputes its hash still breaks the next record's prev."""
    path = log_files(directory)[0]
    lines = lines_of(path)
    record = orjson.loads(lines[5])
    record["payload"]["decision"] = "rewritten"
    del record["hash"]
    body = records.canonical(record)
    lines[5] = records.with_hash(body, hashlib.sha256(body).hexdigest())
    path.write_bytes(b"".join(lines))
    return record["seq"] + 1


@pytest.mark.parametrize(
    "mutate",
    [
        _edit_field,
        _delete_line,
        _reorder,
        _truncate_mid_line,
        _truncate_whole_lines,
        _edit_checkpoint_signature,
        _rehash_edited_record,
    ],
)
def test_every_mutation_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str], mutate) -> None:  # type: ignore[no-untyped-def]
    directory, _ = make_log(tmp_path, 40, checkpoint_records=15)
    assert verify_cli(directory, capsys)[0] == 0
    bad_seq = mutate(directory)
    code, out = verify_cli(directory, capsys)
    assert code == 2, out
    assert f"TAMPERED at seq {bad_seq}:" in out


def rotated_log(tmp_path: Path) -> Path:
    directory, _ = make_log(tmp_path, 200, rotate_bytes=8000, checkpoint_records=50)
    assert len(log_files(directory)) >= 4
    return directory


def test_rotation_carries_the_chain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = rotated_log(tmp_path)
    files = log_files(directory)
    for before, after in itertools.pairwise(files):
        last = orjson.loads(lines_of(before)[-1])
        first = orjson.loads(lines_of(after)[0])
        assert records.kind_of(last) == records.ROTATE and last["payload"]["next_file"] == after.name
        assert first["prev"] == last["hash"] and first["seq"] == last["seq"] + 1
    assert verify_cli(directory, capsys)[0] == 0


def test_swapping_files_in_a_rotation_set_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = rotated_log(tmp_path)
    files = log_files(directory)
    a, b = files[1], files[2]
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    first_seq = int(a.stem.split("-")[1])
    code, out = verify_cli(directory, capsys)
    assert code == 2 and f"TAMPERED at seq {first_seq}:" in out


def test_removing_a_rotated_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = rotated_log(tmp_path)
    victim = log_files(directory)[1]
    victim.unlink()
    code, out = verify_cli(directory, capsys)
    assert code == 2 and f"TAMPERED at seq {int(victim.stem.split('-')[1])}:" in out


def test_unsealed_records_are_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    writer = AuditWriter(directory, key, settings=WriterSettings(checkpoint_records=10_000))
    for _ in range(5):
        writer.append(records.DECISION, {"decision": "deny"}, sync=True)
    code, out = verify_cli(directory, capsys)
    assert code == 0 and "unsealed: 7 record(s)" in out  # log.open, writer.open and five decisions
    writer.close()


def test_wrong_pinned_key_fails(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory, _ = make_log(tmp_path)
    other = tmp_path / "other.pem"
    AuditWriter(tmp_path / "elsewhere", other).close()
    code, out = verify_cli(directory, capsys, "--public-key", str(other))
    assert code == 2 and "signature does not verify" in out


def test_torn_line_is_set_aside_with_a_gap_record(tmp_path: Path) -> None:
    directory, key = make_log(tmp_path, 10)
    path = log_files(directory)[-1]
    fragment = b'{"corr":"writer-x","from":"adl-enforcer","hash":"ab'
    with open(path, "ab") as f:
        f.write(fragment)
    assert not verify_directory(directory).intact
    before = len(lines_of(path))
    with AuditWriter(directory, key) as writer:
        writer.append(records.DECISION, {"decision": "allow"})
    report = verify_directory(directory)
    assert report.intact, report.problem
    torn = [g for g in report.gaps if g["reason"] == "torn_write"]
    assert len(torn) == 1 and torn[0]["bytes"] == len(fragment)
    assert (directory / torn[0]["saved_as"]).read_bytes() == fragment
    assert len(lines_of(path)) > before  # every earlier line kept


def test_a_writer_that_never_closed_leaves_a_gap_record(tmp_path: Path) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    abandoned = AuditWriter(directory, key)
    abandoned.append(records.DECISION, {"decision": "deny"})
    # simulate its death: drop its registry lock without the clean close
    os.close(abandoned._registry_fd)
    with AuditWriter(directory, key):
        pass
    report = verify_directory(directory)
    assert report.intact
    assert [g["writer"] for g in report.gaps if g["reason"] == "writer_stopped_uncleanly"] == [abandoned.writer_id]


def test_failure_is_sticky_and_closed(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit", tmp_path / "k.pem")
    writer.append(records.DECISION, {"decision": "allow"})
    os.close(writer._fd)  # the log file vanishes from under the writer
    with pytest.raises(AuditUnavailable):
        writer.append(records.DECISION, {"decision": "allow"})
    writer._fd = os.open(os.devnull, os.O_WRONLY)
    with pytest.raises(AuditUnavailable, match="failed earlier"):
        writer.append(records.DECISION, {"decision": "allow"})
    with pytest.raises(AuditUnavailable):
        writer.append(records.DECISION, {"not json": object()})  # type: ignore[dict-item]


def test_append_many_chains_like_single_appends_with_one_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = AuditWriter(tmp_path / "audit", tmp_path / "k.pem")
    first = writer.append(records.DECISION, {"n": 0})
    writes: list[int] = []
    real_write = os.write
    monkeypatch.setattr(
        "enforcer.audit.writer.os.write", lambda fd, data: writes.append(len(data)) or real_write(fd, data)
    )
    receipts = writer.append_many([Entry(records.DECISION, {"n": n}, corr=f"c{n}") for n in range(1, 6)])
    monkeypatch.undo()
    assert len(writes) == 1  # five records, one write(2)
    assert writer.append_many([]) == []
    last = writer.append(records.DECISION, {"n": 6})
    writer.close()
    assert [r.seq for r in receipts] == list(range(first.seq + 1, first.seq + 6)) and last.seq == first.seq + 6
    lines = [orjson.loads(line) for line in lines_of(log_files(tmp_path / "audit")[0])]
    by_seq = {line["seq"]: line for line in lines}
    for n, receipt in enumerate(receipts, start=1):
        assert by_seq[receipt.seq]["hash"] == receipt.hash
        assert by_seq[receipt.seq]["payload"] == {"n": n} and by_seq[receipt.seq]["corr"] == f"c{n}"
    code, out = verify_cli(tmp_path / "audit", capsys)
    assert code == 0, out


def test_a_failing_entry_fails_the_whole_batch_and_writes_none(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit", tmp_path / "k.pem")
    before = log_files(tmp_path / "audit")[0].read_bytes()
    with pytest.raises(AuditUnavailable):
        writer.append_many([Entry(records.DECISION, {"n": 1}), Entry(records.DECISION, {"bad": object()})])
    assert log_files(tmp_path / "audit")[0].read_bytes() == before


def test_unserialisable_payload_is_refused(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "audit", tmp_path / "k.pem")
    with pytest.raises(AuditUnavailable):
        writer.append(records.DECISION, {"value": object()})  # type: ignore[dict-item]


def test_a_corrupted_tail_refuses_to_open(tmp_path: Path) -> None:
    directory, key = make_log(tmp_path, 5)
    path = log_files(directory)[-1]
    lines = lines_of(path)
    lines[-1] = lines[-1].replace(b'"sealed_seq":', b'"sealed_seq":9')
    path.write_bytes(b"".join(lines))
    with pytest.raises(AuditUnavailable, match="does not verify"):
        AuditWriter(directory, key)


@pytest.mark.parametrize(
    "fields",
    [
        {"corr": "s-1", "payload": {"b": 1, "a": [{"z": None, "y": "é\u2028"}]}, "trace": None, "priority": "normal"},
        {"corr": 'quote"d', "payload": {}, "trace": {"trace_id": "t", "span_id": "s"}, "priority": "high"},
        {"corr": "x", "payload": {"id": ',"id":"', "𝄞": 1.5, "big": 2**62}, "trace": None, "priority": "low"},
    ],
)
def test_fast_envelope_is_byte_identical_to_the_canonical_record(fields: dict) -> None:  # type: ignore[type-arg]
    common = {
        "log_id": "abcd",
        "seq": 7,
        "prev": "f" * 64,
        "ts_ns": 1_795_000_000_123_456_789,
        "kind": "decision",
        "source": "adl-enforcer",
    }
    as_dict = {  # the AEE v1 envelope, member by member
        "v": "1",
        "id": "abcd.0000000000000007",  # zero-padded: ids sort as records do
        "ts": records.format_ts(common["ts_ns"]),
        "type": "event",
        "from": "adl-enforcer",
        "to": "audit",
        "intent": "adl.enforcer.decision",
        "corr": fields["corr"],
        "reply_to": None,
        "trace": fields["trace"],
        "priority": fields["priority"],
        "requires": None,
        "payload": fields["payload"],
        "sig": None,
        "seq": 7,
        "prev": "f" * 64,
    }
    head, tail = records.envelope_parts(**common, **fields)
    assert head + tail == records.canonical(as_dict)
    assert head.endswith(b'"from":"adl-enforcer"') and tail.startswith(b',"id":')  # where the hash member goes


def test_an_entry_that_cannot_be_encoded_is_refused_alone_and_the_log_goes_on(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem")
    before = writer.append(records.DECISION, {"n": 0})
    too_big = 2**70  # beyond what the record encoder takes
    batch = [Entry(records.DECISION, {"n": 1}), Entry(records.DECISION, {"n": too_big}), Entry(records.DECISION, {})]
    with pytest.raises(RecordRejected) as rejected:
        writer.append_many(batch)
    assert rejected.value.index == 1 and isinstance(rejected.value, AuditUnavailable)
    assert writer.failed is None
    after = writer.append_many([batch[0], batch[2]])
    assert [r.seq for r in after] == [before.seq + 1, before.seq + 2]  # nothing of the refused append was written
    writer.close()
    report = verify_directory(tmp_path / "log")
    assert report.intact, report


def test_a_write_in_progress_counts_as_stalled_and_bounds_the_wait_of_others(tmp_path: Path) -> None:
    writer = AuditWriter(tmp_path / "log", tmp_path / "key.pem", settings=WriterSettings(lock_wait_s=0.2))
    assert writer.stalled_s() == 0.0
    entered, release = threading.Event(), threading.Event()
    real_write = os.write

    def slow_write(fd: int, data: bytes) -> int:
        if b'"stuck"' in data:
            entered.set()
            release.wait(10)
        return real_write(fd, data)

    os.write = slow_write  # type: ignore[assignment]
    try:
        stuck = threading.Thread(target=lambda: writer.append(records.DECISION, {"stuck": True}))
        stuck.start()
        assert entered.wait(5)
        time.sleep(0.3)
        assert writer.stalled_s() >= 0.3  # seen without taking the writer's lock
        started = time.monotonic()
        with pytest.raises(AuditStalled):
            writer.append(records.DECISION, {"n": 1})
        assert time.monotonic() - started < 2
        assert writer.failed is None
    finally:
        release.set()
        os.write = real_write  # type: ignore[assignment]
        stuck.join(10)
    assert writer.stalled_s() == 0.0
    writer.append(records.DECISION, {"n": 2})
    writer.close()
    assert verify_directory(tmp_path / "log").intact
