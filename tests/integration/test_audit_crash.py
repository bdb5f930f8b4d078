"""The audit log under crashes, a full disk, concurrent writer processes and `adl-audit follow`."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import orjson
import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, WriterSettings, records
from enforcer.audit.query import iter_records
from enforcer.audit.verify import verify_directory

WRITER_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from enforcer.audit import AuditWriter, WriterSettings
    directory, key, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    writer = AuditWriter(directory, key, settings=WriterSettings(background_flush=True, checkpoint_records=500))
    for i in range(count):
        receipt = writer.append("decision", {"decision": "deny", "n": i, "pad": "x" * 200})
        os.write(1, b"%d\\n" % receipt.seq)  # acknowledged: append returned
    writer.close()
    """
)


def spawn_writer(directory: Path, key: Path, count: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER_SCRIPT, str(directory), str(key), str(count)],
        stdout=subprocess.PIPE,
    )


def test_sigkill_during_heavy_writing_loses_no_acknowledged_record(tmp_path: Path) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    child = spawn_writer(directory, key, 10_000_000)
    acked: list[int] = []
    buffer = b""
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        while len(acked) < 5000 and time.monotonic() < deadline:
            buffer += os.read(child.stdout.fileno(), 65536)
            *done, buffer = buffer.split(b"\n")
            acked += [int(x) for x in done]
        os.kill(child.pid, signal.SIGKILL)
        rest = child.stdout.read()
        acked += [int(x) for x in (buffer + rest).split(b"\n") if x]
    finally:
        child.kill()
        child.wait(timeout=10)
    assert len(acked) >= 5000
    with AuditWriter(directory, key):
        pass  # the next start notices the dead writer (and repairs a torn line if there is one)
    report = verify_directory(directory)
    assert report.intact, report.problem
    assert any(g["reason"] == "writer_stopped_uncleanly" for g in report.gaps)
    present = {r["seq"] for r in iter_records(directory) if records.kind_of(r) == records.DECISION}
    assert set(acked) <= present


def test_concurrent_writer_processes_share_one_chain(tmp_path: Path) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    AuditWriter(directory, key).close()  # create the log and key first
    children = [spawn_writer(directory, key, 1500) for _ in range(3)]
    try:
        outputs = [c.communicate(timeout=120)[0] for c in children]
    finally:
        for c in children:
            c.kill()
    acked = [int(x) for out in outputs for x in out.split()]
    assert len(acked) == 4500 and len(set(acked)) == 4500
    report = verify_directory(directory)
    assert report.intact, report.problem
    assert not report.gaps


@pytest.fixture
def tiny_fs(tmp_path: Path):  # type: ignore[no-untyped-def]
    mount_point = tmp_path / "tiny"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_full_disk_fails_closed_and_recovers(tmp_path: Path, tiny_fs: Path) -> None:
    directory, key = tiny_fs / "audit", tmp_path / "k.pem"
    writer = AuditWriter(directory, key, settings=WriterSettings(checkpoint_records=10**9))
    written = 0
    with pytest.raises(AuditUnavailable):
        for i in range(100_000):
            writer.append(records.DECISION, {"n": i, "pad": "y" * 300})
            written += 1
    assert written > 10
    with pytest.raises(AuditUnavailable, match="failed earlier"):
        writer.append(records.DECISION, {"n": -1})
    # the operator grows the filesystem and starts again: nothing acknowledged is lost
    subprocess.run(["mount", "-o", "remount,size=256k", str(tiny_fs)], check=True)
    with AuditWriter(directory, key) as again:
        again.append(records.DECISION, {"n": "after"})
    report = verify_directory(directory)
    assert report.intact, report.problem
    ns = [r["payload"].get("n") for r in iter_records(directory) if records.kind_of(r) == records.DECISION]
    assert ns[:written] == list(range(written)) and ns[-1] == "after"


def test_follow_prints_new_matching_records(tmp_path: Path) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    writer = AuditWriter(directory, key, settings=WriterSettings(rotate_bytes=3000))
    follower = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enforcer.cli.audit",
            "--dir",
            str(directory),
            "follow",
            "--decision",
            "deny",
            "--json",
            "--interval",
            "0.05",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert follower.stdout is not None
        # It starts at the end of the log whenever it gets going: markers until one shows it is.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            writer.append(records.DECISION, {"decision": "deny", "n": -1}, sync=True)
            if select.select([follower.stdout], [], [], 0.2)[0]:
                break
        for i in range(30):  # crosses several rotations
            writer.append(records.DECISION, {"decision": "deny" if i % 2 else "allow", "n": i}, sync=True)
        writer.close()
        seen: list[int] = []
        while len(seen) < 15 and time.monotonic() < deadline:
            line = follower.stdout.readline()
            if line and (n := orjson.loads(line)["payload"]["n"]) != -1:
                seen.append(n)
        assert seen == list(range(1, 30, 2))
    finally:
        follower.kill()
        follower.wait(timeout=10)


ROTATION_CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from enforcer.audit import AuditWriter, WriterSettings
    from enforcer.audit.writer import log_name

    switch_to = AuditWriter._switch_to

    def crash_before_the_next_file(self, path, *, create):
        # The rotate record is written and synced; the process dies before the next file exists.
        if create and path.name != log_name(1):
            os._exit(9)
        switch_to(self, path, create=create)

    AuditWriter._switch_to = crash_before_the_next_file
    writer = AuditWriter(sys.argv[1], sys.argv[2], settings=WriterSettings(rotate_bytes=2000))
    for i in range(100):
        receipt = writer.append("decision", {"decision": "deny", "n": i, "pad": "x" * 200}, sync=True)
        os.write(1, b"%d\\n" % receipt.seq)
    """
)


def test_a_crash_between_the_rotate_record_and_the_next_file_leaves_a_log_that_opens(tmp_path: Path) -> None:
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    child = subprocess.run(
        [sys.executable, "-c", ROTATION_CRASH_SCRIPT, str(directory), str(key)], capture_output=True, timeout=60
    )
    assert child.returncode == 9, child.stderr  # it died inside the rotation
    acked = [int(x) for x in child.stdout.split()]
    assert acked
    rotate = [r for r in iter_records(directory) if records.kind_of(r) == records.ROTATE]
    assert len(rotate) == 1 and not (directory / rotate[0]["payload"]["next_file"]).exists()
    # The next start continues the chain in the file the rotation named: the log is not stuck.
    with AuditWriter(directory, key) as again:
        again.append(records.DECISION, {"decision": "deny", "n": "after"}, sync=True)
    assert (directory / rotate[0]["payload"]["next_file"]).exists()
    report = verify_directory(directory)
    assert report.intact, report.problem
    decisions = [r for r in iter_records(directory) if records.kind_of(r) == records.DECISION]
    assert set(acked) <= {r["seq"] for r in decisions}
    assert decisions[-1]["payload"]["n"] == "after"


CRASH_BEFORE_HEAD_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import orjson
    from enforcer.audit import AuditWriter, WriterSettings, head
    from enforcer.audit.writer import log_files
    directory, key, background = Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    original = head.Head.write

    def write(self, receipt):
        named = [orjson.loads(line) for line in log_files(directory)[-1].read_bytes().splitlines()]
        if any(r["seq"] == receipt.seq and r["intent"] == "adl.enforcer.checkpoint" for r in named):
            os._exit(9)  # the checkpoint is in the log, HEAD does not name it yet
        original(self, receipt)

    head.Head.write = write
    writer = AuditWriter(directory, key, settings=WriterSettings(checkpoint_records=5, background_flush=background))
    for i in range(50):
        writer.append("decision", {"decision": "deny", "n": i})
    time.sleep(10)  # a flusher writes HEAD within group_ms
    os._exit(3)
    """
)


@pytest.mark.parametrize("background", [False, True], ids=["sync", "flusher"])
def test_a_crash_between_the_first_checkpoint_and_its_head_is_not_tampering(tmp_path: Path, background: bool) -> None:
    """The writer dies after its first checkpoint is in the log and before HEAD.json names it: what
    a crash leaves verifies, before and after the next writer appends (a log cut back to a checkpoint
    with HEAD removed still fails: tests/attacks/test_audit_tampering.py)."""
    directory, key = tmp_path / "audit", tmp_path / "k.pem"
    crashed = subprocess.run(
        [sys.executable, "-c", CRASH_BEFORE_HEAD_SCRIPT, str(directory), str(key), "1" if background else "0"],
        timeout=60,
    )
    assert crashed.returncode == 9
    kinds = [records.kind_of(r) for r in iter_records(directory)]
    if background:  # appends went on, checkpoints included, while the flusher had HEAD to write
        assert kinds.count(records.CHECKPOINT) >= 1
    else:
        assert kinds.count(records.CHECKPOINT) == 1 and kinds[-1] == records.CHECKPOINT
    report = verify_directory(directory)
    assert report.intact, report.problem
    writer = AuditWriter(directory, key, settings=WriterSettings(checkpoint_records=1000))
    try:
        writer.append(records.DECISION, {"decision": "deny", "n": "after the crash"})
        report = verify_directory(directory)
        assert report.intact, report.problem
        assert report.gaps and report.gaps[-1]["reason"] == "writer_stopped_uncleanly"
    finally:
        writer.close()
    assert verify_directory(directory).intact
