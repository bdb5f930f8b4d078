"""adl-approve: list, show, approve, reject and watch the human approvals adl-enforcerd is waiting for.

Talks to the daemon's admin socket (mode 0600: operators, never agents). The approver's name is
recorded in the audit log with the decision; it defaults to the login name of the calling user, and
a name given with --as is recorded together with that login name so the log says who typed it.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import grpc

from .. import paths
from ..text import printable, printable_json
from ..v1 import enforcer_pb2 as pb
from ..v1 import enforcer_pb2_grpc as pb_grpc
from ..version import version_text

EXIT_OK, EXIT_NOTHING, EXIT_USAGE, EXIT_REFUSED = 0, 1, 2, 3
DEADLINE_S = 5.0

EPILOG = """\
examples:
  adl-approve list
  adl-approve show apr-0123456789abcdef0123
  adl-approve approve apr-0123456789abcdef0123 --note "refund checked with the customer"
  adl-approve reject apr-0123456789abcdef0123 --as "alice (on call)" --note "amount too high"
  adl-approve watch --agent invoice-processor

The admin socket is ADL_ENFORCER_ADMIN_SOCKET, else the daemon's default: /run/adl-enforcer/admin.sock
as root, ~/.local/state/adl-enforcer/run/admin.sock for a daemon run as a user (--admin overrides).
exit codes: 0 done, 1 nothing pending / no such approval, 2 usage or connection error,
            3 the daemon refused (already decided, expired, audit log unavailable).
"""


def default_admin_address() -> str:
    # The same default as adl-enforcerd's own admin_socket, so that one user's daemon is found too.
    path = os.environ.get("ADL_ENFORCER_ADMIN_SOCKET") or str(paths.runtime_dir(os.environ) / "admin.sock")
    return path if path.startswith("unix:") else "unix:" + path


def login_name() -> str:
    """Who is at the keyboard: the sudo caller when run through sudo, else the uid's account name."""
    sudo_user = os.environ.get("SUDO_USER")
    if sudo_user and os.getuid() == 0:
        return sudo_user
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid:{os.getuid()}"


def approver_identity(given: str | None) -> str:
    login = login_name()
    if not given or given.strip() == login:
        return login
    return f"{given.strip()} (unix user {login})"


def approval_dict(approval: pb.Approval, now_ms: int | None = None) -> dict[str, Any]:
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        arguments: Any = json.loads(approval.arguments_json) if approval.arguments_json else {}
    except ValueError:
        arguments = approval.arguments_json
    return {
        "approval_id": approval.approval_id,
        "decision_id": approval.decision_id,
        "agent": approval.agent,
        "session": approval.session,
        "tool": approval.tool,
        "arguments": arguments,  # masked by the daemon as in the audit log
        "reasons": [{"rule": r.rule, "pointer": r.pointer, "text": r.text} for r in approval.reasons],
        "created": _iso(approval.created_unix_ms),
        "expires": _iso(approval.expires_unix_ms),
        "expires_in_s": max(0, (approval.expires_unix_ms - now_ms) // 1000),
    }


def _iso(unix_ms: int) -> str:
    return datetime.fromtimestamp(unix_ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _one_line(item: dict[str, Any]) -> str:
    args = json.dumps(item["arguments"], sort_keys=True, ensure_ascii=False)
    if len(args) > 80:
        # Visibly cut: "..." alone could be part of the arguments, and the approver must know to
        # read the rest before deciding.
        args = f"{args[:77]}… [cut: {len(args)} characters in all, adl-approve show {item['approval_id']}]"
    session = f" session={item['session']}" if item["session"] else ""
    # Callers chose the tool name and arguments: escaped, they cannot drive the approver's terminal.
    return printable(
        f"{item['approval_id']}  {item['agent']}  {item['tool']} {args}  (expires in {item['expires_in_s']} s){session}"
    )


def _details(item: dict[str, Any]) -> str:
    lines = [
        f"approval   {item['approval_id']}",
        f"agent      {item['agent']}",
        f"session    {item['session'] or '-'}",
        f"tool       {item['tool']}",
        "arguments  "
        + printable_json(json.dumps(item["arguments"], indent=2, sort_keys=True, ensure_ascii=False)).replace(
            "\n", "\n           "
        ),
        f"decision   {item['decision_id']}",
        f"created    {item['created']}",
        f"expires    {item['expires']} (in {item['expires_in_s']} s)",
    ]
    for reason in item["reasons"]:
        lines.append(
            f"why        {reason['rule']}: {reason['text']}" + (f" [{reason['pointer']}]" if reason["pointer"] else "")
        )
    return "\n".join(line if line.startswith("arguments  ") else printable(line) for line in lines)


class Admin:
    def __init__(self, address: str, deadline_s: float = DEADLINE_S) -> None:
        self.channel = grpc.insecure_channel(address)
        self.stub = pb_grpc.AdminStub(self.channel)
        self.deadline_s = deadline_s

    def pending(self, agent: str = "") -> list[pb.Approval]:
        return list(self.stub.ListPending(pb.ListPendingRequest(agent=agent), timeout=self.deadline_s).pending)

    def find(self, approval_id: str) -> pb.Approval | None:
        return next((a for a in self.pending() if a.approval_id == approval_id), None)

    def decide(self, approval_id: str, approve: bool, approver: str, note: str) -> pb.ApprovalResult:
        call = self.stub.Approve if approve else self.stub.Reject
        request = pb.ApprovalDecision(approval_id=approval_id, approver=approver, note=note)
        return call(request, timeout=self.deadline_s)

    def close(self) -> None:
        self.channel.close()


def _print(args: argparse.Namespace, value: Any, human: str) -> None:
    if args.json:
        print(printable_json(json.dumps(value, sort_keys=True, ensure_ascii=False)), flush=True)
    elif human:
        print(human, flush=True)


def cmd_list(admin: Admin, args: argparse.Namespace) -> int:
    items = [approval_dict(a) for a in admin.pending(args.agent or "")]
    items.sort(key=lambda i: i["created"])
    if args.json:
        _print(args, {"pending": items}, "")
    elif not items:
        print("no approvals pending")
    else:
        for item in items:
            print(_one_line(item))
    return EXIT_OK if items else EXIT_NOTHING


def cmd_show(admin: Admin, args: argparse.Namespace) -> int:
    found = admin.find(args.approval_id)
    if found is None:
        return _not_pending(args)
    item = approval_dict(found)
    _print(args, item, _details(item))
    return EXIT_OK


def _not_pending(args: argparse.Namespace) -> int:
    message = f"no pending approval {args.approval_id!r} (unknown, already decided or expired)"
    if args.json:
        _print(args, {"error": "not_found", "detail": message}, "")
    else:
        print(f"adl-approve: {message}", file=sys.stderr)
    return EXIT_NOTHING


def _decide(approve: bool) -> Callable[[Admin, argparse.Namespace], int]:
    def run(admin: Admin, args: argparse.Namespace) -> int:
        approver = approver_identity(args.approver)
        try:
            result = admin.decide(args.approval_id, approve, approver, args.note or "")
        except grpc.RpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.NOT_FOUND:
                return _not_pending(args)
            if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.UNAVAILABLE):
                detail = exc.details()
                _print(args, {"error": code.name.lower(), "detail": detail}, "")
                if not args.json:
                    print(f"adl-approve: refused: {detail}", file=sys.stderr)
                return EXIT_REFUSED
            raise
        verb = "approved" if approve else "rejected"
        value = {
            "approval_id": args.approval_id,
            "outcome": verb,
            "approver": approver,
            "note": args.note or "",
            "audit_seq": result.receipt.seq,
            "audit_hash": result.receipt.hash,
        }
        _print(args, value, f"{args.approval_id} {verb} by {approver} (audit record {result.receipt.seq})")
        return EXIT_OK

    return run


def cmd_watch(admin: Admin, args: argparse.Namespace) -> int:
    """Print each approval as it opens and as it leaves the pending list, until interrupted,
    --count new approvals have been shown, or --timeout seconds have passed."""
    shown: dict[str, dict[str, Any]] = {}
    seen = 0
    deadline = time.monotonic() + args.timeout if args.timeout else None
    while True:
        current = {a.approval_id: approval_dict(a) for a in admin.pending(args.agent or "")}
        for approval_id, item in current.items():
            if approval_id not in shown:
                shown[approval_id] = item
                seen += 1
                _print(args, {"event": "pending", **item}, "pending  " + _one_line(item))
        for approval_id in [k for k in shown if k not in current]:
            item = shown.pop(approval_id)
            _print(
                args,
                {"event": "closed", "approval_id": approval_id, "agent": item["agent"], "tool": item["tool"]},
                printable(f"closed   {approval_id}  {item['agent']}  {item['tool']} (decided or expired)"),
            )
        if args.count and seen >= args.count:
            return EXIT_OK
        if deadline is not None and time.monotonic() >= deadline:
            return EXIT_OK if seen else EXIT_NOTHING
        time.sleep(args.interval)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="adl-approve",
        description="Decide the tool calls adl-enforcerd holds for a human (human-in-the-loop approvals).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--admin", metavar="ADDRESS", help="admin socket (unix:/path or a path)")
    parser.add_argument("--json", action="store_true", help="JSON output (one object per line for watch)")
    parser.add_argument("--version", action="version", version=version_text("adl-approve"))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    listing = sub.add_parser(
        "list", help="pending approvals, oldest first, one line each (long arguments cut: say so, see show)"
    )
    listing.add_argument("--agent", help="only this agent's")
    listing.set_defaults(run=cmd_list)

    show = sub.add_parser("show", help="one pending approval: the tool call with its masked arguments and why")
    show.add_argument("approval_id")
    show.set_defaults(run=cmd_show)

    for name, approve in (("approve", True), ("reject", False)):
        verb = sub.add_parser(name, help=f"{name} a pending tool call; recorded in the audit log with your name")
        verb.add_argument("approval_id")
        verb.add_argument("--as", dest="approver", metavar="NAME", help="approver name (default: your login name)")
        verb.add_argument("--note", default="", help="why; recorded with the decision")
        verb.set_defaults(run=_decide(approve))

    watch = sub.add_parser("watch", aliases=["follow"], help="print approvals as they open and close")
    watch.add_argument("--agent", help="only this agent's")
    watch.add_argument("--interval", type=float, default=1.0, metavar="S", help="poll interval (default 1 s)")
    watch.add_argument("--count", type=int, default=0, metavar="N", help="stop after N new approvals")
    watch.add_argument("--timeout", type=float, default=0, metavar="S", help="stop after S seconds")
    watch.set_defaults(run=cmd_watch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "interval", 1.0) <= 0:
        parser.error("--interval must be positive")
    admin = Admin(
        args.admin
        if args.admin and args.admin.startswith("unix:")
        else (f"unix:{args.admin}" if args.admin else default_admin_address())
    )
    try:
        return int(args.run(admin, args))
    except grpc.RpcError as exc:
        code = exc.code()
        detail = exc.details()
        if args.json:
            print(json.dumps({"error": code.name.lower() if code else "unknown", "detail": detail}))
        else:
            print(f"adl-approve: {code.name if code else 'UNKNOWN'}: {detail}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        admin.close()


if __name__ == "__main__":
    sys.exit(main())
