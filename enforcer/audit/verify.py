"""Independent verification of an audit directory: chain, sequence, files, signatures, head.

Everything is recomputed from the bytes on disk; the writer is not trusted. The first problem stops
the walk (later records cannot be trusted once the chain is broken) and is reported with the seq
where it was found.

Anchors are copies of HEAD.json saved earlier, where whoever can write the directory cannot reach
them: the log must still hold the record each names, with the same hash. On the host alone, a log
cut back to an older checkpoint together with that time's HEAD.json verifies; against an anchor
saved after that checkpoint it does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import orjson
from cryptography.hazmat.primitives.asymmetric import ed25519

from . import keys, records
from .head import HEAD_FILE, read_head_file
from .logfiles import log_files, log_name, open_for_reading
from .records import GENESIS, canonical


@dataclass
class VerifyReport:
    files: int = 0
    records: int = 0
    last_seq: int = 0
    last_hash: str = GENESIS
    checkpoints: int = 0
    sealed_seq: int = 0
    gaps: list[dict[str, Any]] = field(default_factory=list)
    bad_seq: int | None = None
    problem: str | None = None
    key_source: str = ""
    head_seq: int | None = None
    anchors: int = 0  # saved heads checked
    # The hashes of the records at the seqs HEAD.json and the anchors name, noted by the walk.
    named_hashes: dict[int, str] = field(default_factory=dict, repr=False)

    @property
    def intact(self) -> bool:
        return self.problem is None

    @property
    def unsealed(self) -> int:
        return self.last_seq - self.sealed_seq

    def as_json(self) -> dict[str, Any]:
        return {
            "intact": self.intact,
            "files": self.files,
            "records": self.records,
            "last_seq": self.last_seq,
            "checkpoints": self.checkpoints,
            "sealed_through_seq": self.sealed_seq,
            "unsealed_records": self.unsealed,
            "head_seq": self.head_seq,
            "anchors_checked": self.anchors,
            "gaps": self.gaps,
            "first_bad_seq": self.bad_seq,
            "problem": self.problem,
            "key": self.key_source,
        }


_HASH_MEMBER = b',"hash":"'  # 9 bytes, then 64 hex digits and a quote
_SPECIAL = {records.INTENT_PREFIX + k: k for k in (records.CHECKPOINT, records.GAP, records.ROTATE)}


class _Broken(Exception):
    def __init__(self, seq: int, problem: str) -> None:
        super().__init__(problem)
        self.seq, self.problem = seq, problem


def verify_directory(
    directory: Path,
    public_key: ed25519.Ed25519PublicKey | None = None,
    anchors: Mapping[str, dict[str, Any]] | None = None,
) -> VerifyReport:
    """Verify the log; `public_key` pins the sealing key, otherwise the key recorded in the log's
    first record is used (and the report says so: that only proves internal consistency).
    `anchors`: saved copies of HEAD.json (read_head), by the name to report them under."""
    report = VerifyReport(key_source="pinned" if public_key else "")
    # HEAD is read before the log: a live writer only names records already written, so the walk
    # that follows finds the one it names.
    try:
        head = read_head_file(directory / HEAD_FILE)
    except ValueError:
        head = b""  # a symlink, a FIFO, a device: reported unreadable by _check_head
    saved = anchors or {}
    named = {seq for seq in [_named_seq(head), *(a["seq"] for a in saved.values())] if seq is not None}
    try:
        key = _walk(directory, public_key, report, named)
        _check_head(head, report, key)
        for name, anchor in saved.items():
            _check_anchor(name, anchor, report, key)
    except _Broken as broken:
        report.bad_seq, report.problem = broken.seq, broken.problem
        # The walk counts the records it accepted, from seq 1 on: a break leaves them the good ones.
        report.last_seq = report.records
    return report


def _named_seq(head: bytes | None) -> int | None:
    """The seq HEAD.json names; None when there is none or it is no signed head (_check_head then
    reports it after the walk)."""
    try:
        return read_head(head)["seq"] if head is not None else None
    except ValueError:
        return None


def _walk(
    directory: Path, pinned: ed25519.Ed25519PublicKey | None, report: VerifyReport, named: set[int]
) -> ed25519.Ed25519PublicKey | None:
    """Walk every file; returns the sealing key used (pinned, or the one log.open records), and
    notes the hashes of the records at the seqs in `named`."""
    files = log_files(directory)
    if not files:
        raise _Broken(1, f"no audit files in {directory}")
    key = pinned
    expected_seq, prev = 1, GENESIS
    rotate_to: str | None = None
    for path in files:
        report.files += 1
        if rotate_to is not None and path.name != rotate_to:
            raise _Broken(expected_seq, f"{path.name} follows a rotation that named {rotate_to}")
        if path.name != log_name(expected_seq):
            raise _Broken(
                expected_seq, f"{path.name} should start at seq {expected_seq} (expected {log_name(expected_seq)})"
            )
        rotate_to = None
        try:
            with open_for_reading(path) as f:
                data = f.read()
        except OSError as exc:  # a symlink, a FIFO: no log file a writer makes
            raise _Broken(expected_seq, f"{path.name} is unreadable ({exc.strerror or exc})") from None
        lines = data.split(b"\n")
        torn = lines.pop()  # b"" when the file ends with a newline
        for line in lines:  # the hot loop: runs once per record of the whole log
            if rotate_to is not None:
                raise _Broken(expected_seq, f"record after the rotation marker in {path.name}")
            try:
                record = orjson.loads(line)
                seq, record_prev, intent = record["seq"], record["prev"], record["intent"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise _Broken(expected_seq, f"{path.name}: line {report.records + 1} is not an audit record") from None
            if seq != expected_seq:
                raise _Broken(
                    expected_seq, f"expected seq {expected_seq}, found {seq!r} (line missing, moved or inserted)"
                )
            if record_prev != prev:
                raise _Broken(
                    seq, "prev does not match the hash of the record before it (records reordered or removed)"
                )
            at = line.find(_HASH_MEMBER)
            digest = line[at + 9 : at + 73]
            if at < 0 or sha256(line[:at] + line[at + 74 :]).hexdigest().encode() != digest:
                problem = records.check_line_hash(line)
                raise _Broken(seq, f"record content changed after it was written: {problem}")
            if seq == 1:
                recorded = _key_from_genesis(record)
                if key is None:
                    key = recorded
                    report.key_source = "from the log itself (pass --public-key to pin the sealing key)"
            elif intent in _SPECIAL:
                kind = _SPECIAL[intent]
                if kind == records.CHECKPOINT:
                    _check_checkpoint(record, key, report)
                elif kind == records.GAP:
                    report.gaps.append({"seq": seq, "ts": record.get("ts"), **record.get("payload", {})})
                else:
                    rotate_to = record.get("payload", {}).get("next_file")
            prev = digest.decode()
            if seq in named:
                report.named_hashes[seq] = prev
            expected_seq += 1
            report.records += 1
        if torn:
            raise _Broken(expected_seq, f"{path.name} ends in a torn or truncated line ({len(torn)} bytes)")
        if rotate_to is None and path != files[-1]:
            raise _Broken(expected_seq, f"{path.name} ends without a rotation marker but more files follow")
    if rotate_to is not None and not (directory / rotate_to).exists():
        raise _Broken(expected_seq, f"the last rotation names {rotate_to}, which is missing")
    report.last_seq, report.last_hash = expected_seq - 1, prev
    return key


def _key_from_genesis(record: dict[str, Any]) -> ed25519.Ed25519PublicKey:
    if records.kind_of(record) != records.LOG_OPEN:
        raise _Broken(1, "the first record is not the log.open record (log start removed?)")
    raw = record.get("payload", {}).get("public_key")
    try:
        key = keys.public_from_raw(raw)
    except (TypeError, ValueError):
        raise _Broken(1, "log.open carries no usable public key") from None
    return key


def _check_checkpoint(record: dict[str, Any], key: ed25519.Ed25519PublicKey | None, report: VerifyReport) -> None:
    sig = record.get("sig")
    if key is None or not isinstance(sig, dict) or not isinstance(sig.get("value"), str):
        raise _Broken(record["seq"], "checkpoint without a signature")
    body = {k: v for k, v in record.items() if k != "hash"}
    body["sig"] = None
    if not keys.signature_ok(key, sig["value"], canonical(body)):
        raise _Broken(record["seq"], "checkpoint signature does not verify with the sealing key")
    report.checkpoints += 1
    report.sealed_seq = record["seq"]


def _check_head(head_bytes: bytes | None, report: VerifyReport, key: ed25519.Ed25519PublicKey | None) -> None:
    """HEAD.json names the newest checkpoint (before a log's first checkpoint, the record before
    it); a log that ends before the record it names was cut off."""
    if head_bytes is None:
        # A writer makes HEAD before a log's first checkpoint and moves it to each checkpoint after:
        # without HEAD, a log cut back to any checkpoint would look whole. Only a log never sealed
        # may lack it.
        if report.checkpoints:
            raise _Broken(
                report.last_seq + 1,
                f"{HEAD_FILE} is missing although the log has {report.checkpoints} checkpoint(s): "
                f"records after seq {report.last_seq} may have been removed",
            )
        return
    try:
        head = read_head(head_bytes)
    except ValueError:
        raise _Broken(report.last_seq + 1, f"{HEAD_FILE} is unreadable") from None
    _check_signature(head, HEAD_FILE, report, key)
    seq = report.head_seq = head["seq"]
    if seq > report.last_seq:
        raise _Broken(
            report.last_seq + 1,
            f"log ends at seq {report.last_seq} but the signed head says seq {seq} was written (log truncated)",
        )
    if report.named_hashes.get(seq) != head["hash"]:
        raise _Broken(seq, f"seq {seq} is not the record the signed head names")


def _check_anchor(
    name: str, anchor: dict[str, Any], report: VerifyReport, key: ed25519.Ed25519PublicKey | None
) -> None:
    """A saved head: signed with the sealing key, naming a record the log still holds as it was."""
    what = f"the saved head {name}"
    _check_signature(anchor, what, report, key)
    seq = anchor["seq"]
    if seq > report.last_seq:
        raise _Broken(
            report.last_seq + 1,
            f"log ends at seq {report.last_seq} but {what} says seq {seq} was written "
            "(records removed: the log was cut back or rolled back)",
        )
    if report.named_hashes.get(seq) != anchor["hash"]:
        raise _Broken(seq, f"seq {seq} is not the record {what} names (the log was replaced or rewritten)")
    report.anchors += 1


def read_head(data: bytes) -> dict[str, Any]:
    """A signed head (HEAD.json or a saved copy of it), read strictly; its signature is not checked
    here. ValueError when it is not one."""
    head = records.parse_line(data)  # its RecordError is a ValueError
    seq, digest, sig = head.get("seq"), head.get("hash"), head.get("sig")
    if type(seq) is not int or seq < 1 or not isinstance(digest, str) or not isinstance(sig, str):
        raise ValueError("a signed head has an integer seq from 1, a hash and a sig")
    return head


def _check_signature(
    head: dict[str, Any], what: str, report: VerifyReport, key: ed25519.Ed25519PublicKey | None
) -> None:
    unsigned = {k: v for k, v in head.items() if k != "sig"}
    if key is None or not keys.signature_ok(key, head["sig"], canonical(unsigned)):
        raise _Broken(report.last_seq + 1, f"{what} signature does not verify with the sealing key")
