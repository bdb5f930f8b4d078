"""The audit writer's parts on their own: reading a log file's tail (torn or not), setting a torn
line aside, HEAD.json replacement, when group commit, checkpoints and rotation fall due, the chain's
lines, the writer registry, and reading timestamps back."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

from enforcer.audit import AuditWriter, keys, records, registry
from enforcer.audit.appender import Entry, Receipt, RecordRejected
from enforcer.audit.chain import Chain
from enforcer.audit.head import HEAD_FILE, Head, replace_head, signed_head
from enforcer.audit.logfiles import log_files, log_name, previous_tail, read_tail, set_torn_aside
from enforcer.audit.records import GENESIS, canonical
from enforcer.audit.schedule import WriterSettings, checkpoint_due, group_commit_due, next_due, rotation_due
from enforcer.audit.verify import verify_directory

# -- the tail of a log file ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"", (None, 0, b"")),
        (b'{"a":1}\n', (b'{"a":1}', 8, b"")),
        (b'{"a":1}\n{"b":2}\n', (b'{"b":2}', 16, b"")),
        (b'{"a":1}\n{"b":2}\n{"c":', (b'{"b":2}', 16, b'{"c":')),
        (b'{"c":', (None, 0, b'{"c":')),  # the first line never completed
    ],
)
def test_read_tail_names_the_last_whole_line_and_the_torn_bytes(
    tmp_path: Path, content: bytes, expected: tuple[bytes | None, int, bytes]
) -> None:
    path = tmp_path / "log.jsonl"
    path.write_bytes(content)
    assert read_tail(path) == expected


def test_read_tail_reads_back_past_its_chunk_for_long_lines(tmp_path: Path) -> None:
    long_line = b'{"x":"' + b"y" * 200_000 + b'"}'
    torn = b'{"z":"' + b"w" * 150_000
    path = tmp_path / "log.jsonl"
    path.write_bytes(b'{"a":1}\n' + long_line + b"\n" + torn)
    last, end, rest = read_tail(path)
    assert last == long_line and end == 8 + len(long_line) + 1 and rest == torn


def test_a_log_ending_in_a_long_record_and_a_long_torn_one_opens_again(tmp_path: Path) -> None:
    """Together they are longer than one read-back chunk: the last whole record is still found."""
    directory, key = tmp_path / "log", tmp_path / "key.pem"
    crashed = AuditWriter(directory, key)
    last = crashed.append(records.DECISION, {"args": "x" * 50_000}, sync=True)
    os.close(crashed._registry_fd)  # the writer dies here, in the middle of its next record
    torn = b'{"corr":"' + b"z" * 40_000
    with open(log_files(directory)[-1], "ab") as f:
        f.write(torn)
    with AuditWriter(directory, key) as writer:
        assert writer.append(records.DECISION, {"n": 1}).seq > last.seq
    report = verify_directory(directory)
    assert report.intact, report.problem
    assert [g["bytes"] for g in report.gaps if g["reason"] == "torn_write"] == [len(torn)]


def test_a_torn_line_is_moved_aside_and_cut_off(tmp_path: Path) -> None:
    path = tmp_path / log_name(1)
    whole, torn = b'{"a":1}\n', b'{"b":'
    path.write_bytes(whole + torn)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    try:
        gap = set_torn_aside(tmp_path, path, fd, len(whole), torn)
    finally:
        os.close(fd)
    assert path.read_bytes() == whole
    assert (tmp_path / gap["saved_as"]).read_bytes() == torn
    assert gap == {
        "reason": "torn_write",
        "file": path.name,
        "offset": len(whole),
        "bytes": len(torn),
        "fragment_sha256": hashlib.sha256(torn).hexdigest(),
        "saved_as": f"torn/{path.name}.{len(whole)}",
    }


def test_an_empty_file_after_a_rotation_continues_from_the_file_before(tmp_path: Path) -> None:
    (tmp_path / log_name(1)).write_bytes(b'{"seq":1}\n{"seq":2}\n')
    (tmp_path / log_name(3)).write_bytes(b"")
    assert previous_tail(tmp_path, tmp_path / log_name(3)) == b'{"seq":2}'
    with pytest.raises(records.RecordError, match="holds no complete record"):
        previous_tail(tmp_path, tmp_path / log_name(1))  # nothing before the first file


# -- HEAD.json ------------------------------------------------------------------------------------------


def _key() -> tuple[ed25519.Ed25519PrivateKey, str]:
    key = ed25519.Ed25519PrivateKey.generate()
    return key, keys.key_id(key.public_key())


def _head_ok(head: dict[str, object], key: ed25519.Ed25519PrivateKey) -> bool:
    unsigned = {k: v for k, v in head.items() if k != "sig"}
    return keys.signature_ok(key.public_key(), str(head["sig"]), canonical(unsigned))


def test_head_moves_forward_only_signed_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    key, kid = _key()
    newer = signed_head(Receipt(20, "b" * 64, "log"), key, kid, 1_795_000_000_000_000_000)
    assert replace_head(tmp_path, newer, "w1")
    older = signed_head(Receipt(10, "a" * 64, "log"), key, kid, 1_795_000_000_000_000_001)
    assert not replace_head(tmp_path, older, "w2")  # another writer's older checkpoint
    assert not replace_head(tmp_path, newer, "w2")  # the same one again
    stored = orjson.loads((tmp_path / HEAD_FILE).read_bytes())
    assert stored == newer and _head_ok(stored, key)
    assert stored["seq"] == 20 and stored["hash"] == "b" * 64 and stored["log_id"] == "log"
    assert sorted(p.name for p in tmp_path.iterdir()) == [HEAD_FILE]


def test_an_unreadable_head_is_replaced(tmp_path: Path) -> None:
    key, kid = _key()
    (tmp_path / HEAD_FILE).write_bytes(b"{not json")
    head = Head(tmp_path, key, kid, "w1", lambda: 1_795_000_000_000_000_000)
    try:
        head.write(Receipt(3, "c" * 64, "log"))
    finally:
        head.close()
    stored = orjson.loads((tmp_path / HEAD_FILE).read_bytes())
    assert stored["seq"] == 3 and _head_ok(stored, key)
    assert head.since == 0.0  # nothing left in progress


# -- when group commit, checkpoints and rotation fall due -----------------------------------------------

MS = 1_000_000


def test_a_group_commits_at_its_size_or_its_age() -> None:
    settings = WriterSettings(group_records=4, group_ms=5.0)
    assert not group_commit_due(settings, now=4 * MS, unsynced=3, last_sync_ns=0)
    assert group_commit_due(settings, now=4 * MS, unsynced=4, last_sync_ns=0)
    assert group_commit_due(settings, now=5 * MS, unsynced=1, last_sync_ns=0)


def test_checkpoints_and_rotation_fall_due_by_count_size_or_age() -> None:
    settings = WriterSettings(checkpoint_records=10, checkpoint_seconds=1.0, rotate_bytes=100, rotate_seconds=2.0)
    assert not checkpoint_due(settings, now=999 * MS, since_checkpoint=9, last_checkpoint_ns=0)
    assert checkpoint_due(settings, now=0, since_checkpoint=10, last_checkpoint_ns=0)
    assert checkpoint_due(settings, now=1000 * MS, since_checkpoint=0, last_checkpoint_ns=0)
    assert not rotation_due(settings, now=1999 * MS, size=99, file_started_ns=0)
    assert rotation_due(settings, now=0, size=100, file_started_ns=0)
    assert rotation_due(settings, now=2000 * MS, size=0, file_started_ns=0)


def test_the_next_due_point_is_the_earliest_job() -> None:
    settings = WriterSettings(
        group_records=8, group_ms=5.0, checkpoint_records=100, checkpoint_seconds=60.0, rotate_bytes=1 << 20
    )
    stand = {
        "now": 50 * MS,
        "seq": 1000,
        "unsynced": 3,
        "last_sync_ns": 48 * MS,
        "since_checkpoint": 97,
        "last_checkpoint_ns": 0,
        "file_started_ns": 0,
    }
    idle = next_due(settings, **stand, flusher_busy=False)
    assert idle.ns == 53 * MS  # the group's age limit comes first
    assert idle.seq == 1000 + 3  # the checkpoint is 3 records away, the group 5
    assert idle.size == 1 << 20
    busy = next_due(settings, **{**stand, "since_checkpoint": 0}, flusher_busy=True)
    assert busy.ns == 55 * MS  # the group being synced is not counted: the next is a whole group later
    assert busy.seq == 1000 + 8


# -- the chain ------------------------------------------------------------------------------------------


def test_lines_chain_onto_each_other_and_a_rejected_entry_leaves_the_chain_as_it_was() -> None:
    ticks = iter(range(1_795_000_000_000_000_000, 1_795_000_000_000_001_000))
    chain = Chain("test", "writer-x", lambda: next(ticks))
    chain.log_id = "log"
    data, receipts = chain.lines([Entry(records.DECISION, {"n": 1}), Entry(records.DECISION, {"n": 2}, corr="c")])
    first, second = (orjson.loads(line) for line in data.splitlines())
    assert [r.seq for r in receipts] == [1, 2] and (chain.seq, chain.hash) == (2, receipts[1].hash)
    assert first["prev"] == GENESIS and second["prev"] == first["hash"] == receipts[0].hash
    assert first["corr"] == "writer-x" and second["corr"] == "c"
    assert all(records.check_line_hash(line) is None for line in data.splitlines())
    stand = (chain.seq, chain.hash, chain.now)
    with pytest.raises(RecordRejected) as rejected:
        chain.lines([Entry(records.DECISION, {"n": 3}), Entry(records.DECISION, {"n": 2**70})])
    assert rejected.value.index == 1
    assert (chain.seq, chain.hash, chain.now) == stand


# -- the writer registry --------------------------------------------------------------------------------


def test_only_writers_that_stopped_are_reaped_and_only_once_recorded(tmp_path: Path) -> None:
    (tmp_path / registry.WRITERS_DIR).mkdir()
    live = registry.register(tmp_path, "live", "2026-11-25T00:00:00.000000000Z")
    dead = registry.register(tmp_path, "dead", "2026-11-25T00:00:01.000000000Z")
    os.close(dead)  # its flock goes with it, as with a killed process
    try:
        found = registry.dead_writers(tmp_path)
        info = next(found)
        assert info == {"writer": "dead", "pid": os.getpid(), "started": "2026-11-25T00:00:01.000000000Z"}
        assert (tmp_path / registry.WRITERS_DIR / "dead").exists()  # kept until the caller has recorded it
        assert list(found) == []
        assert sorted(p.name for p in (tmp_path / registry.WRITERS_DIR).iterdir()) == ["live"]
    finally:
        registry.unregister(tmp_path, "live", live)
    assert list((tmp_path / registry.WRITERS_DIR).iterdir()) == []


def test_the_lease_says_when_it_was_newly_taken(tmp_path: Path) -> None:
    lease = registry.Lease(tmp_path)
    try:
        assert lease.take() and lease.held
        assert not lease.take()  # already held: nobody else can have appended meanwhile
        lease.release()
        assert not lease.held
        assert lease.take()
    finally:
        lease.release()
        lease.close()


# -- timestamps ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "head",
    [
        "1970-01-01T00:00:00", "2024-02-29T23:59:59", "0001-01-01T00:00:00", "9999-12-31T23:59:59",
        "2026-06-30T23:59:60", "2026-06-30T23:59:61",  # leap seconds: strptime's spelling
        "2026-1-2T3:4:5", "2026-01-01t00:00:00", "2026-01- 1T00:00:00", "２０２６-01-01T00:00:00",
        "2023-02-29T00:00:00", "2026-13-01T00:00:00", "2026-01-00T00:00:00", "2026-01-01T24:00:00",
        "2026-01-01T00:00:0a", " 2026-01-01T00:00:00", "2026-01-01T00:00:00 ", "2026+01-01T00:00:00", "",
    ],
)  # fmt: skip
def test_a_timestamp_reads_as_strptime_reads_it(head: str) -> None:
    """parse_ts reads format_ts's form without time.strptime, and every other string as before."""
    import calendar
    import time

    try:
        expected: int | type[Exception] = calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        expected = ValueError
    try:
        got: int | type[Exception] = records.parse_ts(head + ".5Z")
    except ValueError:
        got = ValueError
    assert got == (expected if expected is ValueError else expected * 1_000_000_000 + 500_000_000)


def test_format_ts_round_trips_without_loading_strptime() -> None:
    code = (
        "import random, sys\n"
        "from enforcer.audit import records\n"
        "rnd = random.Random(7)\n"
        "for ns in [0, 253402300799_999999999, *(rnd.randrange(253402300800 * 10**9) for _ in range(5000))]:\n"
        "    assert records.parse_ts(records.format_ts(ns)) == ns, ns\n"
        "print('_strptime' in sys.modules, 'calendar' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.split() == ["False", "False"]


def test_a_writer_given_relative_paths_keeps_them_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The egress filter reopens the writer's paths after the agent has started, from a working
    directory the agent may write to: a relative --audit-dir must already name the operator's."""
    monkeypatch.chdir(tmp_path)
    writer = AuditWriter("audit", "keys/audit-key.pem", source="test")
    monkeypatch.chdir("/")
    assert writer.directory == tmp_path / "audit" and writer.key_path == tmp_path / "keys" / "audit-key.pem"
