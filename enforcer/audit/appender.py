"""What an audit log takes and gives: entries, receipts, the errors of an append, and `Appender`,
the one type for anything records are appended to (the writer, the daemon's sink around it, or a
wrapper of either). Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol


class AuditUnavailable(Exception):
    """A record could not be written. The caller must treat the action it was recording as denied."""


class AuditStalled(AuditUnavailable):
    """Another append or sync of this writer has not finished within WriterSettings.lock_wait_s."""


class RecordRejected(AuditUnavailable):
    """One entry of an append cannot be encoded as a record. Nothing of that append was written and
    the log is still usable: the entry is the problem, not the log."""

    def __init__(self, index: int, detail: str) -> None:
        super().__init__(f"entry {index} cannot be encoded: {detail}")
        self.index = index


class Entry(NamedTuple):
    """One record for append_many."""

    kind: str
    payload: dict[str, Any]
    corr: str | None = None
    trace: dict[str, str] | None = None
    priority: str = "normal"


class Receipt(NamedTuple):
    seq: int
    hash: str
    log_id: str  # the record's id is "<log_id>.<seq>"
    size: int = 0  # bytes of the record's line in the log: every append's receipt has it (0: not an append's)


class Appender(Protocol):
    """Something records are appended to: append() is one entry of append_many(). A class that
    names Appender as its base gets this append(); any other class with the same methods matches."""

    def append_many(self, entries: Sequence[Entry], *, sync: bool = False) -> list[Receipt]:
        """Append `entries` in order; with `sync`, return once they are on stable storage."""
        ...

    def append(
        self,
        kind: str,
        payload: dict[str, Any],
        *,
        corr: str | None = None,
        trace: dict[str, str] | None = None,
        priority: str = "normal",
        sync: bool = False,
    ) -> Receipt:
        return self.append_many((Entry(kind, payload, corr, trace, priority),), sync=sync)[0]
