"""Reading, filtering and summarising audit records for adl-audit. Reads files directly, so it
works with the daemon down; a torn last line (a writer still writing, or a crash) is skipped here
and reported by verify."""

from __future__ import annotations

import fnmatch
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson

from ..text import printable
from . import records
from .logfiles import log_files, open_for_reading

_RELATIVE = re.compile(r"^-?(\d+)\s*(s|sec|m|min|h|hour|d|day|w|week)s?$")
_UNITS = {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hour": 3600, "d": 86400, "day": 86400, "w": 604800}
_UNITS["week"] = 604800


class QueryError(ValueError):
    pass


def parse_time(text: str, now: datetime) -> int:
    """Nanoseconds since the epoch for ISO 8601, a relative offset (-1h, -30m, -2d, -1w) or one of
    now, today, yesterday, this-week (local time; weeks start on Monday)."""
    word = text.strip().lower()
    local_midnight = now.astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    moments = {
        "now": now,
        "today": local_midnight,
        "yesterday": local_midnight - timedelta(days=1),
        "this-week": local_midnight - timedelta(days=local_midnight.weekday()),
    }
    if word in moments:
        return _ns(moments[word])
    match = _RELATIVE.match(word)
    if match:
        return _ns(now - timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)]))
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise QueryError(
            f"cannot read time {text!r}: use ISO 8601 (2026-11-21T09:00Z), -1h / -30m / -2d / -1w, "
            "or today, yesterday, this-week"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # a time without zone means local time
    return _ns(moment)


def _ns(moment: datetime) -> int:
    delta = moment.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000


def parse_seq_range(text: str) -> tuple[int, int]:
    low, sep, high = text.partition("..")
    try:
        if not sep:
            return int(text), int(text)
        return (int(low) if low else 0), (int(high) if high else 2**63)
    except ValueError:
        raise QueryError(f"--seq takes N, FROM..TO, FROM.. or ..TO, not {text!r}") from None


@dataclass
class Filters:
    """Values within one field are ORed; fields are ANDed. Names and paths take shell globs."""

    decision: list[str] = field(default_factory=list)
    agent: list[str] = field(default_factory=list)
    session: list[str] = field(default_factory=list)
    tool: list[str] = field(default_factory=list)
    host: list[str] = field(default_factory=list)
    path: list[str] = field(default_factory=list)
    type: list[str] = field(default_factory=list)
    rule: list[str] = field(default_factory=list)
    seq: list[tuple[int, int]] = field(default_factory=list)
    since_ns: int | None = None
    until_ns: int | None = None

    def matches(self, record: dict[str, Any]) -> bool:
        payload: dict[str, Any] = record["payload"] if isinstance(record.get("payload"), dict) else {}
        seq = record.get("seq")
        if self.seq and not (type(seq) is int and any(lo <= seq <= hi for lo, hi in self.seq)):
            return False
        if self.since_ns is not None or self.until_ns is not None:
            ts = _record_ns(record)
            if ts is None or (self.since_ns is not None and ts < self.since_ns):
                return False
            if self.until_ns is not None and ts > self.until_ns:
                return False
        checks = (
            (self.decision, [str(payload.get("decision", "")).lower()], False),
            (self.agent, [payload.get("agent")], True),
            (self.session, [record.get("corr")], True),
            (self.tool, [payload.get("tool")], True),
            (self.host, [payload.get("host")], True),
            (self.path, [payload.get("path")], True),
            (self.type, [records.kind_of(record)], True),
            (self.rule, _rules(payload), True),
        )
        return all(not wanted or _any_match(wanted, values, glob) for wanted, values, glob in checks)


def _any_match(wanted: list[str], values: Iterable[Any], glob: bool) -> bool:
    present = [v for v in values if isinstance(v, str) and v]
    if glob:
        return any(fnmatch.fnmatchcase(v, w) for v in present for w in wanted)
    return any(v in wanted for v in present)


def _record_ns(record: dict[str, Any]) -> int | None:
    try:
        return records.parse_ts(record["ts"])
    except (KeyError, TypeError, ValueError, AttributeError):  # a line edited by hand: no time
        return None


def iter_records(directory: Path, *, reverse: bool = False) -> Iterator[dict[str, Any]]:
    files = log_files(directory)
    for path in reversed(files) if reverse else files:
        with open_for_reading(path) as f:
            lines = f.read().split(b"\n")
        lines.pop()  # "" after the last newline, or a torn line
        for line in reversed(lines) if reverse else lines:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, dict):
                yield record


def _rules(payload: dict[str, Any]) -> list[str]:
    """The record's rule ids. The readers take lines as they are, edited ones too (verify is what
    says whether they were): a value of another shape is read as text, not a crash."""
    rules = payload.get("rules")
    return [str(rule) for rule in rules] if isinstance(rules, list) else []


def _target(payload: dict[str, Any]) -> str:
    """What a record acted on, as key=value: the tool, host, path or command."""
    return next((f"{k}={payload[k]}" for k in ("tool", "host", "path", "command") if payload.get(k)), "")


def one_line(record: dict[str, Any]) -> str:
    payload: dict[str, Any] = record["payload"] if isinstance(record.get("payload"), dict) else {}
    ts = str(record.get("ts", ""))
    short_ts = ts[:23] + "Z" if len(ts) > 23 else ts
    kind = records.kind_of(record)
    decision = str(payload.get("decision", "")).upper() or "-"
    target = _target(payload)
    detail = [target] if target else []
    if rules := _rules(payload):
        detail.append("rules=" + ",".join(rules))
    for key in ("reason", "exit_code", "signal", "refusal"):
        if payload.get(key) is not None:
            detail.append(f"{key}={payload[key]}")
    agent = payload.get("agent") or "-"
    return printable(
        f"{record.get('seq', '?')!s:>7} {short_ts} {kind:<16} {decision:<5} {agent} {record.get('corr', '-')} "
        + " ".join(detail)
    )


def summarise(matching: Iterable[dict[str, Any]], top: int = 10) -> dict[str, Any]:
    by_decision: Counter[str] = Counter()
    by_agent: Counter[str] = Counter()
    by_tool: Counter[str] = Counter()
    by_rule: Counter[str] = Counter()
    denials: Counter[str] = Counter()
    sessions: dict[str, dict[str, Any]] = {}
    total = 0
    for record in matching:
        total += 1
        payload: dict[str, Any] = record["payload"] if isinstance(record.get("payload"), dict) else {}
        kind = records.kind_of(record)
        decision = payload.get("decision")
        if isinstance(decision, str):
            by_decision[decision] += 1
            by_agent[str(payload.get("agent"))] += 1
            if payload.get("tool"):
                by_tool[str(payload["tool"])] += 1
            rules = _rules(payload)
            for rule in rules:
                by_rule[rule] += 1
            if decision == "deny":
                target = _target(payload)
                first_rule = (rules or [str(payload.get("reason") or kind)])[0]
                denials[f"{first_rule} {target}".strip()] += 1
        if kind in (records.LAUNCH, records.EXIT, records.REFUSED):
            session = sessions.setdefault(str(record.get("corr")), {"session": record.get("corr")})
            session["agent"] = payload.get("agent", session.get("agent"))
            if kind == records.LAUNCH:
                session["started"] = record.get("ts")
            else:
                session.update(
                    ended=record.get("ts"),
                    reason=payload.get("reason", "refused" if kind == records.REFUSED else None),
                    exit_code=payload.get("exit_code"),
                )
    return {
        "records": total,
        "by_decision": dict(by_decision.most_common()),
        "by_agent": dict(by_agent.most_common()),
        "by_tool": dict(by_tool.most_common()),
        "by_rule": dict(by_rule.most_common()),
        "top_denials": [{"what": k, "count": v} for k, v in denials.most_common(top)],
        "sessions": list(sessions.values()),
    }
