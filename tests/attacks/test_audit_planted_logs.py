"""Whoever can write the audit directory (without the sealing key) plants something other than a
regular file under a log file's name, or swaps a log file for a symlink while root's writer works on
it. The writer and verify open every log file by name: a FIFO held either for good (the writer
holding the log's append lease meanwhile, every other writer queued behind it), a symlink had them
read, or the writer cut back, the file it names."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, logfiles, records
from enforcer.audit.query import iter_records
from enforcer.audit.verify import verify_directory
from enforcer.audit.writer import log_files

from ..helpers.audit_logs import make_log


def _sealed_log(tmp_path: Path) -> Path:
    return make_log(tmp_path, 40, checkpoint_records=15)[0]


def _writer_in_child(tmp_path: Path, directory: Path, planted: str) -> subprocess.CompletedProcess[str]:
    """Open and close a writer on `directory` in a child process: a hang is bounded and reported
    (naming what was `planted`). Exit 1 with `refused: ...` on stderr when the writer refused."""
    code = (
        "import sys; from pathlib import Path; from enforcer.audit import AuditUnavailable, AuditWriter\n"
        "try:\n"
        "    AuditWriter(Path(sys.argv[1]), Path(sys.argv[2])).close()\n"
        "except AuditUnavailable as exc:\n"
        "    sys.exit(f'refused: {exc}')\n"
    )
    key = tmp_path / "key" / "audit.pem"
    try:
        return subprocess.run(
            [sys.executable, "-c", code, str(directory), str(key)], timeout=30, capture_output=True, text=True
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the writer waited on {planted}")


@pytest.mark.parametrize("where", ["newest", "oldest"])
def test_a_fifo_planted_as_a_log_file_does_not_hold_the_writer(tmp_path: Path, where: str) -> None:
    """A FIFO nobody opens, named as the newest log file (the writer appends there: open for
    writing waits for a reader) or as one sorting first (the writer reads the log's id from it).
    The writer must refuse the directory at once, as for a symlinked log file. It runs in a child:
    a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    name = "audit-9999999999999999.jsonl" if where == "newest" else "audit-0000000000000000.jsonl"
    os.mkfifo(directory / name)
    done = _writer_in_child(tmp_path, directory, f"a FIFO planted as {name}")
    assert done.returncode == 1 and "refused: " in done.stderr and name in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_verify_names_a_log_file_that_is_not_a_file_without_waiting_on_it(tmp_path: Path, planted: str) -> None:
    """verify read each log file by name: from a FIFO (where it waited for good) and through a
    symlink (the right bytes, by a name no writer makes; or any file root may read). Neither is a log
    file a writer makes: TAMPERED, naming it. verify runs in a child: a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    newest = log_files(directory)[-1]
    saved = tmp_path / "saved.jsonl"
    newest.rename(saved)
    if planted == "fifo":
        os.mkfifo(newest)
    else:
        newest.symlink_to(saved)
    code = "import sys; from enforcer.cli.audit import main; sys.exit(main(['--dir', sys.argv[1], 'verify']))"
    try:
        done = subprocess.run([sys.executable, "-c", code, str(directory)], timeout=30, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail(f"verify waited on {newest.name}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{newest.name} is unreadable" in done.stderr, done.stderr
    newest.unlink()
    saved.rename(newest)  # the control: the same bytes as a file verify
    back = subprocess.run([sys.executable, "-c", code, str(directory)], timeout=30, capture_output=True, text=True)
    assert back.returncode == 0, back.stdout + back.stderr


def test_a_torn_tail_is_not_cut_back_through_a_log_file_swapped_for_a_symlink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer opens the newest log file (never through a symlink), sets its torn last line
    aside, then cut the file back by name: swapped for a symlink in between (by whoever can write
    the directory), the file the link names was cut to the log's length, as root. The swap is made
    at the set-aside's fsync, the window it left open."""
    directory = _sealed_log(tmp_path)
    newest = log_files(directory)[-1]
    end = newest.stat().st_size
    kept = newest.read_bytes()
    with newest.open("ab") as f:
        f.write(b"torn")
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * (end + 4096))
    real_fsync, swapped = os.fsync, []

    def fsync_then_swap(fd: int) -> None:
        real_fsync(fd)
        if not swapped and "/torn/" in os.readlink(f"/proc/self/fd/{fd}"):
            # The torn bytes' copy is durable: the writer goes on to cut the log back.
            newest.rename(tmp_path / "moved.jsonl")
            newest.symlink_to(victim)
            swapped.append(True)

    monkeypatch.setattr(logfiles.os, "fsync", fsync_then_swap)
    with contextlib.suppress(AuditUnavailable):  # refusing the tampered directory is fine; cutting the victim is not
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert swapped
    assert victim.read_bytes() == b"x" * (end + 4096)
    cut = (tmp_path / "moved.jsonl").read_bytes()  # the log itself is cut back, through its descriptor
    assert cut[:end] == kept and cut[end : end + 4] != b"torn", cut[end - 100 : end + 100]


@pytest.mark.parametrize("planted", ["fifo", "symlink", "socket"])
def test_an_entry_planted_in_the_writers_registry_is_neither_followed_nor_waited_on(
    tmp_path: Path, planted: str
) -> None:
    """Each writer reads every entry of writers/ nobody holds (a writer that died) and records what
    it says. Whoever can write the directory replaces writers/ by a directory of its own (the
    writer takes any) and plants there: a FIFO, which the writer opened read-write (its own end
    keeping the read from ever ending) and waited on for good, holding the append lease; or a
    symlink, which it opened read-write as root, locked and read, recording the file's "writer"
    and "pid" (from a JSON file only root may read). Either is recorded as an entry that names
    nothing, and removed. The writer runs in a child: a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    (directory / "writers").rename(directory / "writers.old")
    (directory / "writers").mkdir()
    victim = tmp_path / "secret.json"
    victim.write_text('{"writer": "root-only-secret", "pid": 4242, "started": "x"}')
    victim.chmod(0o600)
    entry = directory / "writers" / "planted"
    if planted == "fifo":
        os.mkfifo(entry)
    elif planted == "socket":  # which no open(2) takes (ENXIO): it refused the whole log
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(entry))
    else:
        entry.symlink_to(victim)
    done = _writer_in_child(tmp_path, directory, f"a {planted} planted in writers/")
    assert done.returncode == 0, done.stderr[-2000:]
    gaps = [
        r["payload"]
        for r in iter_records(directory)
        if r["intent"].endswith(records.GAP) and r["payload"]["reason"] == "writer_stopped_uncleanly"
    ]
    assert gaps == [{**gaps[0], "writer": "planted", "pid": None, "started": None}], gaps
    assert not os.path.lexists(entry) and victim.read_text().startswith('{"writer": "root-only-secret"')


def test_a_fifo_planted_where_a_torn_tail_goes_does_not_hold_the_writer(tmp_path: Path) -> None:
    """The writer copies a torn last line to torn/<file>.<offset>, a name known in advance (and a
    log file with a torn tail is easily made: the one record before it need only hash right). A FIFO
    planted there had its open for writing wait for a reader for good, under the append lease. The
    writer must refuse the directory at once, as for a symlink planted there. It runs in a child: a
    hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    newest = log_files(directory)[-1]
    end = newest.stat().st_size
    with newest.open("ab") as f:
        f.write(b"torn")
    (directory / "torn").mkdir(exist_ok=True)
    os.mkfifo(directory / "torn" / f"{newest.name}.{end}")
    done = _writer_in_child(tmp_path, directory, "a FIFO planted in torn/")
    assert done.returncode == 1 and "refused: " in done.stderr, done.stderr[-2000:]
    assert newest.read_bytes()[end:] == b"torn"  # refused before it cut anything


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_follow_reads_no_log_file_that_is_not_a_file(tmp_path: Path, planted: str) -> None:
    """`adl-audit follow --from-start` (the operator's shell, often root) read the oldest log file by
    name: through a symlink planted there it printed the records of whatever file it names; from
    a FIFO it waited for good before printing anything. Refused, naming it (exit 2). It runs in a
    child: a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    oldest = log_files(directory)[0]
    saved = tmp_path / "saved.jsonl"
    oldest.rename(saved)
    if planted == "fifo":
        os.mkfifo(oldest)
    else:
        oldest.symlink_to(saved)  # records, here; any file root may read, there
    code = (
        "import sys; from enforcer.cli.audit import main\n"
        "sys.exit(main(['--dir', sys.argv[1], 'follow', '--from-start']))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", code, str(directory)], timeout=20, capture_output=True, text=True)
    except subprocess.TimeoutExpired as exc:  # following it for good, having printed what it read
        printed = (exc.stdout or b"")[-300:]
        pytest.fail(f"follow went on with a {planted} planted as {oldest.name}, printing {printed!r}")
    assert done.returncode == 2 and done.stdout == "", (done.stdout[-500:], done.stderr[-500:])
    assert oldest.name in done.stderr, done.stderr


def test_a_symlink_planted_as_the_writers_registry_is_not_followed(tmp_path: Path) -> None:
    """writers/ itself replaced by a symlink to a directory root keeps files in: the writer listed
    the directory it names as its registry, and removed every file there nobody held a lock on (a
    dead writer's entry, to it), recording each as a writer that stopped. The writer must refuse the
    directory, leaving the directory named untouched. It runs in a child: a hang is bounded."""
    directory = _sealed_log(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.conf").write_text("root's\n")
    (victim / "precious.conf").chmod(0o600)
    (victim / "link").symlink_to(victim / "precious.conf")
    (directory / "writers").rename(directory / "writers.old")
    (directory / "writers").symlink_to(victim)
    done = _writer_in_child(tmp_path, directory, "a symlink planted as writers/")
    assert sorted(p.name for p in victim.iterdir()) == ["link", "precious.conf"], done.stderr[-2000:]
    assert (victim / "precious.conf").read_text() == "root's\n"
    assert done.returncode == 1 and "refused: " in done.stderr and "writers" in done.stderr, done.stderr[-2000:]


def test_a_symlink_swapped_in_as_the_writers_registry_is_not_followed_at_the_close(tmp_path: Path) -> None:
    """The same swap once the writer runs: its close removed its entry through the link (a file of
    the writer's name in the directory it names). It must refuse, touch nothing there, and still
    release every descriptor it holds."""
    directory = tmp_path / "audit"
    victim = tmp_path / "victim"
    victim.mkdir()
    w = AuditWriter(directory, tmp_path / "key" / "audit.pem")
    (victim / w.writer_id).write_text("root's\n")
    (directory / "writers").rename(directory / "writers.old")
    (directory / "writers").symlink_to(victim)
    before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(OSError):
        w.close()
    assert (victim / w.writer_id).read_text() == "root's\n"
    assert len(set(os.listdir("/proc/self/fd")) - before) == 0 and len(before - set(os.listdir("/proc/self/fd"))) >= 3


def test_a_broken_log_is_reported_up_to_its_last_good_record(tmp_path: Path) -> None:
    """verify stops at the first break (here a FIFO planted as a newer log file) and names its seq;
    the report's last seq stayed 0 then, so the records checked before the break, and those after
    the last checkpoint, came out negative ('unsealed: -46 record(s)')."""
    directory = _sealed_log(tmp_path)
    os.mkfifo(directory / "audit-9999999999999999.jsonl")
    report = verify_directory(directory)
    assert not report.intact and report.bad_seq is not None
    assert report.last_seq == report.records == report.bad_seq - 1, report
    assert 0 <= report.unsealed < report.last_seq, report
