"""Per-uid budgets on what callers write to the audit log every session shares.

Within each window a uid's records are written up to its budget; beyond it, what the uid asks is
refused and only counted. The count goes into a summary record as soon as the window ends (the
daemon's main loop calls `record_overflows` every tick), not with the uid's next record: a flood
that stops is still accounted for on time. Root (the operator) may be exempt.

The budget slides: it bounds what a uid is granted within any `window_s` seconds, not within each
fixed window. Fixed windows let a uid spend its budget just before one window ended and again just
after, twice its budget in a moment. What was granted is kept per tenth of a window (SLOTS), and a
tenth counts whole for as long as any of it lies within the last `window_s` seconds: a uid that
spent its budget gets more as its oldest grants slide out, a tenth at a time. The windows that
summaries count refusals in stay fixed (each begins with the uid's first request after the last).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..audit import AuditUnavailable, Entry, records
from ..audit.events import refused_members

# What a decision record costs a caller's budget besides its request's bytes: the members that do
# not come from the request (rules, reasons, ids, digests), about.
RECORD_BASE_BYTES = 1024

SLOTS = 10  # a window's grants are kept per tenth of it: the bound slides by tenths

# A request this large is taken for what JSON escaping adds to its strings in its record too: one
# uid's requests decided at once (a batch, concurrent threads) are each taken before any record is
# charged, so the take must hold what the record will. A smaller one cannot add more than a few KiB.
ESCAPES_COUNTED_FROM_BYTES = 2048
_SHORT_ESCAPES = b'\x08\t\n\x0c\r"\\'  # written as two bytes: one more than in the request
_NOT_ESCAPED = bytes(b for b in range(256) if b >= 0x20 and b not in b'"\\')


def record_bytes(request: Any) -> int:
    """What a Check request's strings take in its decision record: its size, and for a large one
    what JSON escaping adds (five bytes more for a control character written as \\u00XX, one for
    the others). Its tool arguments are JSON already, and the record holds them parsed and written
    again: no longer."""
    size = int(request.ByteSize())
    return size if size < ESCAPES_COUNTED_FROM_BYTES else size + _escaped_growth(request)


def _escaped_growth(message: Any) -> int:
    grown = 0
    for member, value in message.ListFields():
        values = value if isinstance(value, Sequence) and not isinstance(value, str) else (value,)
        if member.type == member.TYPE_MESSAGE:
            grown += sum(_escaped_growth(one) for one in values)
        elif member.type == member.TYPE_STRING and member.name != "arguments_json":
            escaped = "".join(values).encode(errors="surrogatepass").translate(None, _NOT_ESCAPED)
            grown += len(escaped) + 4 * len(escaped.translate(None, _SHORT_ESCAPES))
    return grown


@dataclass
class _Window:
    start: float  # time.monotonic(): when the window refusals are counted in began
    counted: int = 0
    used: int = 0  # granted within the slots below: the last window_s seconds, rounded out to whole slots
    slots: deque[list[int]] = field(default_factory=deque)  # [slot number, units granted in it], oldest first


@dataclass(frozen=True)
class Overflow:
    """A uid's window that ended with requests counted only."""

    uid: int
    counted: int
    start: float  # time.monotonic() when the window began
    window_s: float


class UidBudget:
    """`capacity` units (records, or bytes) per uid within any `window_s` seconds."""

    def __init__(self, capacity: int, window_s: float, exempt: frozenset[int] = frozenset()) -> None:
        self.capacity, self.window_s, self.exempt = capacity, window_s, exempt
        self._slot_s = window_s / SLOTS
        self._lock = threading.Lock()
        self._windows: dict[int, _Window] = {}
        self._ended: list[Overflow] = []  # windows replaced before `due` saw them

    def take(self, uid: int, now: float, cost: int = 1, requests: int = 1) -> tuple[bool, int]:
        """(whether `requests` costing `cost` fit the uid's budget and are written in detail, the
        uid's requests counted only in this window so far: 0 when they fit, including them when not)."""
        if uid in self.exempt:
            return True, 0
        with self._lock:
            window = self._window(uid, now)
            slot = self._slide(window, now)
            if window.used + cost <= self.capacity:
                self._grant(window, slot, cost)
                return True, 0
            window.counted += requests
            return False, window.counted

    def reserve(self, uid: int, now: float) -> tuple[bool, int | None]:
        """Take one unit ahead, for a record that may or may not be written later: (whether it may
        be written in detail, the slot it was taken in, for release(); None when nothing was taken)."""
        if uid in self.exempt:
            return True, None
        with self._lock:
            window = self._window(uid, now)
            slot = self._slide(window, now)
            if window.used + 1 > self.capacity:
                return False, None
            self._grant(window, slot, 1)
            return True, slot

    def release(self, uid: int, slot: int, now: float) -> None:
        """Give back a unit reserve() took in `slot`, its record not written. Once the slot has
        slid out of the window the unit weighs on nothing any more: nothing to give back."""
        with self._lock:
            window = self._windows.get(uid)
            if window is None:
                return
            self._slide(window, now)
            for entry in window.slots:
                if entry[0] == slot and entry[1] > 0:
                    entry[1] -= 1
                    window.used -= 1
                    return

    def count(self, uid: int, now: float) -> int:
        """Count one request refused beyond the budget elsewhere (nothing of it written): the uid's
        requests counted only in this window so far, this one included (0 for an exempt uid)."""
        if uid in self.exempt:
            return 0
        with self._lock:
            window = self._window(uid, now)
            self._slide(window, now)
            window.counted += 1
            return window.counted

    def add(self, uid: int, now: float, cost: int) -> None:
        """Charge `cost` more to the uid's window, beyond its capacity if need be: what was written
        for requests already taken cost more than was taken for them, and the uid's next requests
        are refused the sooner."""
        if uid in self.exempt or cost <= 0:
            return
        with self._lock:
            window = self._window(uid, now)
            self._grant(window, self._slide(window, now), cost)

    def used(self, uid: int, now: float) -> int:
        """What the uid was granted within the last window_s seconds (rounded out to whole slots)."""
        with self._lock:
            window = self._windows.get(uid)
            if window is None:
                return 0
            self._slide(window, now)
            return window.used

    def _window(self, uid: int, now: float) -> _Window:
        window = self._windows.get(uid)
        if window is None:
            window = self._windows[uid] = _Window(now)
        elif now - window.start >= self.window_s:  # a new window to count refusals in; the grants slide on
            if window.counted:
                self._ended.append(Overflow(uid, window.counted, window.start, self.window_s))
            window.start, window.counted = now, 0
        return window

    def _slide(self, window: _Window, now: float) -> int:
        """Forget the slots that lie wholly before the last window_s seconds; the slot `now` is in."""
        slot = int(now // self._slot_s)
        slots = window.slots
        while slots and slots[0][0] < slot - SLOTS:
            window.used -= slots.popleft()[1]
        return slot

    @staticmethod
    def _grant(window: _Window, slot: int, cost: int) -> None:
        window.used += cost
        if window.slots and window.slots[-1][0] == slot:
            window.slots[-1][1] += cost
        else:
            window.slots.append([slot, cost])

    def due(self, now: float) -> list[Overflow]:
        """The windows that have ended with requests counted only, each returned once (give them
        back when their summary could not be written). A uid whose window has ended is forgotten
        once none of its grants lie within the last window_s seconds."""
        with self._lock:
            ended, self._ended = self._ended, []
            for uid, window in list(self._windows.items()):
                if now - window.start >= self.window_s:
                    if window.counted:
                        ended.append(Overflow(uid, window.counted, window.start, self.window_s))
                        window.counted = 0
                    last = window.slots[-1][0] if window.slots else None
                    if last is None or (last + 1 + SLOTS) * self._slot_s <= now:  # as _slide, for any `now`
                        del self._windows[uid]
            return ended

    def give_back(self, overflows: list[Overflow]) -> None:
        with self._lock:
            self._ended[:0] = overflows


def wall_ms(monotonic: float) -> int:
    """A time.monotonic() instant as Unix milliseconds."""
    return int((time.time() - (time.monotonic() - monotonic)) * 1000)


def record_overflows(sink: Any, budget: UidBudget, now: float, what: str, counted_as: str, corr: str) -> int:
    """Write a summary record for each of `budget`'s windows that ended with `what` counted only
    (the count in member `counted_as`); how many. Kept for the next call when the log refuses."""
    overflows = budget.due(now)
    if not overflows:
        return 0
    entries = [
        Entry(
            records.REFUSED,
            {
                **refused_members(
                    f"{o.counted} {what} of uid {o.uid} beyond its budget of {budget.capacity} within "
                    f"{o.window_s:g} s were counted only"
                ),
                "caller_uid": o.uid,
                counted_as: o.counted,
                "window_start_ms": wall_ms(o.start),
                "window_s": o.window_s,
            },
            corr,
            None,
            "high",
        )
        for o in overflows
    ]
    try:
        sink.append_many(entries)
    except AuditUnavailable:  # the log is down or stalled (or refused them): counted again next tick
        budget.give_back(overflows)
        return 0
    return len(overflows)
