"""adl-exec --daemon: hand the launch to adl-enforcerd over its launch socket.

The daemon learns our uid from the kernel and receives our stdin, stdout and stderr; the agent runs
under the policy the daemon holds (not a document we send), so a caller cannot bring its own rights.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys

from ..framing import FrameError, recv_frame, send_frame
from .exec_common import EXIT_REFUSED, print_report, refuse
from .launch_messages import LaunchReply, decode_launch_reply, decode_session_ended, encode_launch_request


def _agent(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    if args.agent:
        return str(args.agent)
    if args.adl is None:
        parser.error("--daemon needs --agent NAME or --adl FILE (to name the agent)")
    from ..documents import PolicyFileError, read_document  # only to name the agent: not with --agent

    try:
        document = read_document(args.adl, "adl")
    except PolicyFileError as exc:
        parser.error(str(exc))
    agent = document.get("id") or document.get("name")
    if not isinstance(agent, str) or not agent:
        parser.error(f"{args.adl}: the document names no agent (no id or name)")
    return agent


def _write_session_file(fd: int, reply: LaunchReply) -> None:
    with os.fdopen(fd, "w") as f:
        json.dump({"session": reply.session, "session_token": reply.session_token}, f)


def launch_via_daemon(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str]) -> int:
    if not command:
        parser.error("give the command to run after --")
    ignored = [
        flag
        for flag, value in (
            ("--user", args.user),
            ("--audit-dir", args.audit_dir),
            ("--audit-key", args.audit_key),
            ("--baseline", args.baseline),
            ("--aaif", args.aaif),
            ("--regions", args.regions),
            ("--production", args.production),
        )
        if value
    ]
    if ignored:
        parser.error(
            f"{', '.join(ignored)}: not with --daemon (the agent runs as you, under the daemon's own "
            "policy, baseline and audit log)"
        )
    address = str(args.daemon)
    if not address.startswith("unix:"):
        parser.error(f"--daemon {address}: expected unix:PATH (the daemon's launch socket)")
    request = encode_launch_request(
        agent=_agent(parser, args),
        argv=command,
        environ=dict(os.environ),
        cwd=os.getcwd(),
        accept_unenforced=list(args.accept_unenforced),
        pids_max=args.pids_max,
    )
    session_fd = None
    if args.session_file:  # opened before the launch: a path that cannot be written refuses it
        try:
            session_fd = os.open(args.session_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return refuse(f"--session-file {args.session_file}: {exc.strerror}")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        try:
            conn.connect(address[len("unix:") :])
            send_frame(conn, request, [0, 1, 2])
            frame = recv_frame(conn)
        except (OSError, FrameError) as exc:
            return refuse(f"cannot reach adl-enforcerd at {address}: {exc}")
        if frame is None:
            return refuse("adl-enforcerd closed the connection without answering")
        try:
            reply = decode_launch_reply(frame[0])
        except ValueError as exc:
            return refuse(f"adl-enforcerd sent a malformed reply: {exc}")
        if not reply.accepted:
            return refuse(reply.refusal)
        if session_fd is not None:
            _write_session_file(session_fd, reply)
        try:
            frame = recv_frame(conn)
        except (OSError, FrameError):
            frame = None
    if frame is None:
        print(f"adl-exec: {reply.session}: lost contact with adl-enforcerd; the session was ended", file=sys.stderr)
        return EXIT_REFUSED
    try:
        ended = decode_session_ended(frame[0])
    except ValueError as exc:
        print(f"adl-exec: {reply.session}: adl-enforcerd sent a malformed end of session: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if ended.reason == "refused":
        return refuse(ended.detail)
    if args.report:
        print_report(
            {
                "session": ended.session,
                "reason": ended.reason,
                "exit_code": ended.exit_code,
                "signal": ended.signal or None,
                "duration_ms": ended.duration_ms,
                "creations_refused": ended.creations_refused,
                "kernel_denials": json.loads(ended.kernel_denials_json) if ended.kernel_denials_json else {},
            },
            args.json,
        )
    return ended.exit_code
