"""Audit record shape: an AEE v1 envelope (type "event") whose intent names the record kind, plus the
chain members `seq`, `prev` and `hash`. Pure: no I/O.

Canonical form is compact JSON, UTF-8, members sorted (orjson with OPT_SORT_KEYS). It equals RFC 8785
for the records the enforcer writes except for member names outside the Basic Multilingual Plane,
which JCS orders by UTF-16 units. The rfc8785 package is not used here because it is much slower
and every decision is logged; the session evidence record, which others verify, is JCS.

hash = SHA-256 over the canonical record without its `hash` member; `prev` (inside that record) is
the previous record's hash, so each hash covers the whole history before it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import time
from datetime import date
from typing import Any

import orjson

INTENT_PREFIX = "adl.enforcer."
GENESIS = "0" * 64

# Record kinds (the intent suffix). Kept together so readers and writers agree.
LOG_OPEN = "log.open"
WRITER_OPEN = "writer.open"
WRITER_CLOSE = "writer.close"
GAP = "gap"
CHECKPOINT = "checkpoint"
ROTATE = "rotate"
DECISION = "decision"
LAUNCH = "launch"
EXIT = "exit"
REFUSED = "refused"
EVIDENCE = "session.evidence"
APPROVAL = "approval"
POLICY_LOAD = "policy.load"
DAEMON_START = "daemon.start"
DAEMON_STOP = "daemon.stop"
SESSION_REAPED = "session.reaped"


class RecordError(ValueError):
    """A line that is not a well-formed audit record."""


def canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def with_hash(body: bytes, digest: str) -> bytes:
    """The line for a canonical record body plus its hash, without serialising twice: in sorted
    order `hash` sits right before `id`, and `,"id":"` cannot occur inside a JSON string (every quote
    in one is escaped), so its first occurrence is the member itself."""
    at = body.index(b',"id":"')
    return b"".join((body[:at], b',"hash":"', digest.encode(), b'"', body[at:], b"\n"))


def parse_line(line: bytes) -> dict[str, Any]:
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise RecordError(f"not JSON: {exc}") from None
    if not isinstance(record, dict):
        raise RecordError("not a JSON object")
    return record


_HASH_MEMBER = b',"hash":"'


def check_line_hash(line: bytes) -> str | None:
    """The problem with a stored line's hash, or None: the line minus its hash member must hash to
    that hash. Checking the bytes as stored catches any edit and is twice as fast as re-serialising."""
    at = line.find(_HASH_MEMBER)
    end = at + len(_HASH_MEMBER) + 64
    if at < 0 or line[end : end + 1] != b'"':
        return "no hash member"
    claimed = line[at + len(_HASH_MEMBER) : end]
    actual = hashlib.sha256(line[:at] + line[end + 1 :]).hexdigest().encode()
    if actual == claimed:
        return None
    said = claimed[:16].decode(errors="replace")
    return f"hash mismatch: content hashes to {actual[:16].decode()}…, record says {said}…"


def kind_of(record: dict[str, Any]) -> str:
    intent = record.get("intent")
    if isinstance(intent, str) and intent.startswith(INTENT_PREFIX):
        return intent[len(INTENT_PREFIX) :]
    return str(intent)


_ts_cache: tuple[int, str] = (-1, "")


def format_ts(ns: int) -> str:
    """RFC 3339 UTC with nanoseconds: 2026-11-21T12:00:00.123456789Z."""
    global _ts_cache
    seconds, frac = divmod(ns, 1_000_000_000)
    if _ts_cache[0] != seconds:
        _ts_cache = (seconds, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)))
    return f"{_ts_cache[1]}.{frac:09d}Z"


_EPOCH_DAY = date(1970, 1, 1).toordinal()


def parse_ts(text: str) -> int:
    """Nanoseconds since the epoch from a timestamp written by format_ts."""
    head, _, frac = text.rstrip("Z").partition(".")
    return _seconds(head) * 1_000_000_000 + int((frac or "0").ljust(9, "0")[:9])


def _seconds(head: str) -> int:
    """calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S")), read directly when `head` is in
    the form format_ts writes: time.strptime loads its module and compiles its patterns first."""
    if len(head) == 19 and head[4] == head[7] == "-" and head[10] == "T" and head[13] == head[16] == ":":
        fields = (head[0:4], head[5:7], head[8:10], head[11:13], head[14:16], head[17:19])
        if all(f.isascii() and f.isdigit() for f in fields):
            year, month, day, hour, minute, second = map(int, fields)
            if hour < 24 and minute < 60 and second < 60:
                with contextlib.suppress(ValueError):  # no such day: strptime says why
                    days = date(year, month, day).toordinal() - _EPOCH_DAY
                    return ((days * 24 + hour) * 60 + minute) * 60 + second
    import calendar  # any other spelling strptime accepts (leap seconds, one-digit fields)

    return calendar.timegm(time.strptime(head, "%Y-%m-%dT%H:%M:%S"))


@functools.lru_cache(maxsize=4096)
def _json_text(value: str) -> bytes:
    """A JSON string, cached: source, kind, priority and the log id repeat across records."""
    return orjson.dumps(value)


# The envelope after `hash`, members in sorted order. The placeholders fill id (the log id without
# its closing quote, then the seq in 16 digits, so ids sort as the records do: AEE §11.1), intent,
# payload, prev, priority, seq, trace and ts; the other members are the same in every record.
_TAIL = (
    b',"id":%b.%016d","intent":%b,"payload":%b,"prev":%b,"priority":%b,"reply_to":null,"requires":null,'
    b'"seq":%d,"sig":null,"to":"audit","trace":%b,"ts":"%b","type":"event","v":"1"}'
)


def envelope_parts(
    *,
    log_id: str,
    seq: int,
    prev: str,
    ts_ns: int,
    kind: str,
    source: str,
    corr: str,
    payload: dict[str, Any],
    trace: dict[str, str] | None = None,
    priority: str = "normal",
) -> tuple[bytes, bytes]:
    """The canonical bytes of an unsigned record (see the module docstring for the chain rule) in two
    pieces, split where the `hash` member goes: the record's hash is that of head + tail, and its
    line is head + `,"hash":"<hex>"` + tail.

    Every decision is appended on the hot path; building the 17-member envelope dict, sorting it and
    re-encoding the strings that repeat in every record cost about a third of an append. The members
    are written in sorted order (here and in _TAIL); a unit test holds this byte-for-byte equal to
    canonical() of the same record built as a dict."""
    # corr is not cached: it is often a decision id, new with every record.
    head = b'{"corr":%b,"from":%b' % (orjson.dumps(corr), _json_text(source))
    tail = _TAIL % (
        _json_text(log_id)[:-1],
        seq,
        _json_text(INTENT_PREFIX + kind),
        orjson.dumps(payload, option=orjson.OPT_SORT_KEYS),
        orjson.dumps(prev),
        _json_text(priority),
        seq,
        b"null" if trace is None else orjson.dumps(trace, option=orjson.OPT_SORT_KEYS),
        format_ts(ts_ns).encode(),
    )
    return head, tail
