"""The hash chain: where it stands (the last record's seq and hash) and the lines of the next
records, each chained onto the one before (see records.py for the rule). No I/O: the writer puts
the lines in the log."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from . import records
from .appender import Entry, Receipt, RecordRejected
from .records import GENESIS, canonical

Signer = Callable[[dict[str, Any]], dict[str, Any]]  # a record -> its `sig` member


class Chain:
    """The chain of one log, as one writer extends it. `seq` and `hash` move on as lines are made:
    a line that is then not written leaves the chain ahead of the log, so its writer must stop."""

    __slots__ = ("clock", "default_corr", "hash", "log_id", "now", "seq", "source")

    def __init__(self, source: str, default_corr: str, clock: Callable[[], int]) -> None:
        self.source = source
        self.default_corr = default_corr
        self.clock = clock
        self.log_id = ""
        self.seq = 0
        self.hash = GENESIS
        self.now = clock()  # the time of the last line made

    def line(
        self,
        kind: str,
        payload: dict[str, Any],
        corr: str | None = None,
        trace: dict[str, str] | None = None,
        priority: str = "normal",
        sig_fn: Signer | None = None,
    ) -> tuple[bytes, Receipt]:
        """The next record's line. The argument order is Entry's, so that line(*entry) works."""
        seq = self.seq + 1
        now = self.clock()
        head, tail = records.envelope_parts(
            log_id=self.log_id,
            seq=seq,
            prev=self.hash,
            ts_ns=now,
            kind=kind,
            source=self.source,
            corr=corr or self.default_corr,
            payload=payload,
            trace=trace,
            priority=priority,
        )
        if sig_fn is None:
            digest = hashlib.sha256(head + tail).hexdigest()
            line = b"".join((head, b',"hash":"', digest.encode(), b'"', tail, b"\n"))
        else:  # checkpoints only (one in thousands): parsing the body back is cheap enough
            record = orjson.loads(head + tail)
            record["sig"] = sig_fn(record)
            body = canonical(record)
            digest = hashlib.sha256(body).hexdigest()
            line = records.with_hash(body, digest)
        self.seq, self.hash, self.now = seq, digest, now
        return line, Receipt(seq, digest, self.log_id, len(line))

    def lines(self, entries: Sequence[Entry]) -> tuple[bytes, list[Receipt]]:
        """The entries' lines, chained. If one cannot be encoded, RecordRejected names it and the
        chain is put back as it was."""
        saved = (self.seq, self.hash, self.now)
        lines: list[bytes] = []
        receipts: list[Receipt] = []
        try:
            if len(entries) == 1:  # most appends: no lists to build and join
                data, receipt = self.line(*entries[0])
                return data, [receipt]
            for entry in entries:
                line, receipt = self.line(*entry)
                lines.append(line)
                receipts.append(receipt)
            return b"".join(lines), receipts
        except (TypeError, ValueError) as exc:  # the encoder refused the entry's content
            self.seq, self.hash, self.now = saved
            raise RecordRejected(len(receipts), str(exc)) from exc
