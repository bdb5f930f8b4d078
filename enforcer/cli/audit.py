"""adl-audit: search, follow, show, report and verify the enforcer's audit log (reads the files
directly, so it works with the daemon down)."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from ..audit import keys, records
from ..audit.logfiles import open_for_reading, rotation_target
from ..audit.query import Filters, QueryError, iter_records, one_line, parse_seq_range, parse_time, summarise
from ..audit.verify import read_head, verify_directory
from ..audit.writer import log_files
from ..settings import launch as launch_settings
from ..text import printable, printable_json
from ..version import version_text

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_TAMPERED = 0, 1, 2, 2

EPILOG = """\
filters: values given twice for one field are ORed, different fields are ANDed; --agent, --session,
--tool, --host, --path, --type and --rule take shell globs (--rule 'net.*').
times: ISO 8601 (2026-11-21T09:00Z; no zone = local), relative (-1h, -30m, -2d, -1w), or
today, yesterday, this-week.

examples:
  adl-audit search --decision deny --since -1h
  adl-audit search --agent 'urn:adl:agent:acme:*' --tool approve_invoice --json
  adl-audit follow --decision deny
  adl-audit show 42
  adl-audit report --since today
  adl-audit verify --public-key /var/lib/adl-enforcer/audit-signing-key.pub.pem
  adl-audit verify --anchor /mnt/offhost/HEAD-2026-11-25.json   (a HEAD.json copied off the host)

exit codes: search/follow/show/report 0 found, 1 nothing matched, 2 usage or I/O error;
            verify 0 intact, 2 tampered, truncated or unreadable.
"""

TIME_OPTIONS = ("--since", "--until")


def _add_filters(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("filters")
    for name, text in (
        ("decision", "allow, deny or ask"),
        ("agent", "agent id or name"),
        ("session", "session id (the envelope corr)"),
        ("tool", "tool name"),
        ("host", "network host"),
        ("path", "filesystem path"),
        ("type", "record kind: decision, launch, exit, refused, gap, checkpoint, ..."),
        ("rule", "rule id, e.g. net.host_not_allowed"),
    ):
        group.add_argument(f"--{name}", action="append", default=[], metavar=name.upper(), help=text)
    group.add_argument("--seq", action="append", default=[], metavar="FROM..TO", help="sequence number or range")
    group.add_argument("--since", metavar="TIME", help="records at or after TIME")
    group.add_argument("--until", metavar="TIME", help="records at or before TIME")


def _filters(args: argparse.Namespace) -> Filters:
    now = datetime.now(UTC)
    decisions = [d.lower() for d in args.decision]
    bad = [d for d in decisions if d not in ("allow", "deny", "ask")]
    if bad:
        raise QueryError(f"--decision takes allow, deny or ask, not {bad[0]!r}")
    return Filters(
        decision=decisions,
        agent=args.agent,
        session=args.session,
        tool=args.tool,
        host=args.host,
        path=args.path,
        type=args.type,
        rule=args.rule,
        seq=[parse_seq_range(s) for s in args.seq],
        since_ns=parse_time(args.since, now) if args.since else None,
        until_ns=parse_time(args.until, now) if args.until else None,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adl-audit",
        description="Query and verify the adl-enforcer audit log.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--dir",
        type=Path,
        help="audit directory (default: $ADL_ENFORCER_AUDIT_DIR, else /var/log/adl-enforcer for root, "
        "~/.local/state/adl-enforcer/audit otherwise)",
    )
    parser.add_argument("--version", action="version", version=version_text("adl-audit"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    search = sub.add_parser(
        "search",
        help="records matching filters, one line each",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _add_filters(search)
    search.add_argument("--json", action="store_true", help="one JSON record per line")
    search.add_argument("-n", type=int, metavar="N", help="at most N records")
    search.add_argument("--reverse", action="store_true", help="newest first")

    follow = sub.add_parser("follow", help="print matching records as they are written (tail -f)")
    _add_filters(follow)
    follow.add_argument("--json", action="store_true")
    follow.add_argument("--from-start", action="store_true", help="print existing records first")
    follow.add_argument("--interval", type=float, default=0.2, help="poll interval in seconds (default 0.2)")

    show = sub.add_parser("show", help="one record in full, by seq or id")
    show.add_argument("id", help="sequence number or record id (LOGID.SEQ)")
    show.add_argument("--json", action="store_true", help="compact JSON instead of indented")

    report = sub.add_parser("report", help="counts by decision, agent, tool and rule; top denials; sessions")
    _add_filters(report)
    report.add_argument("--json", action="store_true")
    report.add_argument("--top", type=int, default=10, help="how many top denials (default 10)")

    verify = sub.add_parser("verify", help="check chain, sequence, files, checkpoints and signed head")
    verify.add_argument("--public-key", type=Path, help="pin the sealing key (PEM); default: the key the log records")
    verify.add_argument(
        "--anchor",
        type=Path,
        action="append",
        default=[],
        metavar="SAVED_HEAD",
        help="a copy of HEAD.json saved earlier where the log's writers cannot reach it (repeatable): the log "
        "must still hold the record it names, as it was. Catches a log cut back together with an older "
        "HEAD.json, which the directory alone cannot show",
    )
    verify.add_argument("--json", action="store_true")
    return parser


def _glue_negative_times(argv: list[str]) -> list[str]:
    """Let `--since -1h` work: argparse would read -1h as an option."""
    out: list[str] = []
    it = iter(argv)
    for arg in it:
        if arg in TIME_OPTIONS:
            value = next(it, None)
            out.append(f"{arg}={value}" if value is not None else arg)
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(_glue_negative_times(list(sys.argv[1:] if argv is None else argv)))
    try:
        directory = args.dir or launch_settings.read(os.environ).audit_dir
    except launch_settings.SettingsError as exc:
        parser.error(str(exc))
    if not directory.is_dir() or not log_files(directory):
        print(f"adl-audit: no audit log in {directory} (set --dir or ADL_ENFORCER_AUDIT_DIR)", file=sys.stderr)
        return EXIT_USAGE
    try:
        if args.command == "verify":
            return _verify(directory, args)
        if args.command == "show":
            return _show(directory, args)
        filters = _filters(args)
        if args.command == "search":
            return _search(directory, filters, args)
        if args.command == "report":
            return _report(directory, filters, args)
        return _follow(directory, filters, args)
    except BrokenPipeError:  # the reader went away (`| head`): not an error; before OSError, its base
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return EXIT_OK
    except (QueryError, OSError) as exc:
        print(f"adl-audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK


def _emit(record: dict[str, Any], as_json: bool) -> None:
    text = printable_json(orjson.dumps(record, option=orjson.OPT_SORT_KEYS).decode()) if as_json else one_line(record)
    print(text, flush=True)


def _search(directory: Path, filters: Filters, args: argparse.Namespace) -> int:
    found = (r for r in iter_records(directory, reverse=args.reverse) if filters.matches(r))
    count = 0
    for record in itertools.islice(found, args.n):
        _emit(record, args.json)
        count += 1
    if count == 0:
        print("adl-audit: no record matches", file=sys.stderr)
    return EXIT_OK if count else EXIT_NOTHING


def _show(directory: Path, args: argparse.Namespace) -> int:
    wanted = args.id
    for record in iter_records(directory):
        if str(record.get("seq")) == wanted or record.get("id") == wanted:
            option = orjson.OPT_SORT_KEYS | (0 if args.json else orjson.OPT_INDENT_2)
            print(printable_json(orjson.dumps(record, option=option).decode()))
            return EXIT_OK
    print(f"adl-audit: no record with seq or id {wanted!r}", file=sys.stderr)
    return EXIT_NOTHING


def _report(directory: Path, filters: Filters, args: argparse.Namespace) -> int:
    summary = summarise((r for r in iter_records(directory) if filters.matches(r)), top=args.top)
    if args.json:
        print(json.dumps(summary, indent=2, sort_keys=True))
    else:
        print(f"records: {summary['records']}")
        for title, key in (
            ("decisions", "by_decision"),
            ("agents", "by_agent"),
            ("tools", "by_tool"),
            ("rules", "by_rule"),
        ):
            if summary[key]:
                print(f"{title}:")
                for name, count in summary[key].items():
                    print(f"  {count:>8}  {printable(str(name))}")
        if summary["top_denials"]:
            print("top denials:")
            for item in summary["top_denials"]:
                print(f"  {item['count']:>8}  {printable(str(item['what']))}")
        if summary["sessions"]:
            print("sessions:")
            for s in summary["sessions"]:
                outcome = s.get("reason") or "running or unknown"
                code = f" (exit code {s['exit_code']})" if s.get("exit_code") is not None else ""
                print(
                    printable(f"  {s['session']}  {s.get('agent') or '-'}  {s.get('started') or '-'}  {outcome}{code}")
                )
    return EXIT_OK if summary["records"] else EXIT_NOTHING


def _verify(directory: Path, args: argparse.Namespace) -> int:
    try:
        pinned = keys.load_public(args.public_key) if args.public_key else None
    except (OSError, ValueError, keys.AuditKeyError) as exc:
        print(f"adl-audit: cannot read public key: {exc}", file=sys.stderr)
        return EXIT_USAGE
    anchors = {}
    for path in args.anchor:
        try:
            anchors[str(path)] = read_head(path.read_bytes())
        except (OSError, ValueError) as exc:
            print(printable(f"adl-audit: cannot read the saved head {path}: {exc}"), file=sys.stderr)
            return EXIT_USAGE
    report = verify_directory(directory, pinned, anchors)
    if args.json:
        print(json.dumps(report.as_json(), indent=2, sort_keys=True))
    else:
        print(f"files: {report.files}  records: {report.records}  last seq: {report.last_seq}")
        print(f"checkpoints: {report.checkpoints}  sealed through seq {report.sealed_seq}")
        if report.unsealed:
            print(
                f"unsealed: {report.unsealed} record(s) after the last checkpoint (their removal would not be detected)"
            )
        for gap in report.gaps:
            print(printable(f"gap at seq {gap['seq']}: {gap.get('reason')} ({_gap_detail(gap)})"))
        print(f"key: {report.key_source}")
        if report.head_seq is not None and report.head_seq < report.sealed_seq:
            # Whoever can write the directory can put an older signed HEAD.json back: a copy saved
            # from it would guard nothing after that seq (a writer moves HEAD just after each checkpoint).
            print(
                f"HEAD.json names seq {report.head_seq}, the log is sealed through seq {report.sealed_seq}: "
                "do not save it as an anchor now (older than the log's newest checkpoint)"
            )
        if args.anchor:
            print(f"saved heads: {report.anchors} of {len(anchors)} hold")
    if report.intact:
        if not args.json:
            print("intact")
        return EXIT_OK
    # The problem may quote names from the directory, which whoever tampered with it chose.
    print(printable(f"TAMPERED at seq {report.bad_seq}: {report.problem}"), file=sys.stderr)
    return EXIT_TAMPERED


def _gap_detail(gap: dict[str, Any]) -> str:
    keys_shown = ("writer", "pid", "file", "bytes", "saved_as", "last_seq_before_detection")
    return ", ".join(f"{k}={gap[k]}" for k in keys_shown if gap.get(k) is not None)


def _follow(directory: Path, filters: Filters, args: argparse.Namespace) -> int:
    for record in _tail(directory, args.from_start, args.interval):
        if filters.matches(record):
            _emit(record, args.json)
    return EXIT_OK


def _tail(directory: Path, from_start: bool, interval: float) -> Iterator[dict[str, Any]]:
    """Records as they appear, across rotations; only whole lines are read."""
    files = log_files(directory)
    current = files[0] if from_start else files[-1]
    offset = 0 if from_start else current.stat().st_size
    while True:
        with open_for_reading(current) as f:  # never through a symlink nor waiting on a FIFO planted there
            f.seek(offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            yield record
            if records.kind_of(record) == records.ROTATE:
                try:
                    current, offset = directory / rotation_target(record), 0
                except records.RecordError as exc:
                    raise QueryError(printable(str(exc))) from None
                break
        else:
            offset += end
            if end == 0:
                time.sleep(interval)
            continue
        while not current.exists():
            time.sleep(interval)


if __name__ == "__main__":
    sys.exit(main())
