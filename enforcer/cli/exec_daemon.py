"""adl-exec --daemon: hand the launch to adl-enforcerd over its launch socket.

The daemon learns our uid from the kernel and receives our stdin, stdout and stderr; the agent runs
under the policy the daemon holds (not a document we send), so a caller cannot bring its own rights.

Light on purpose: a well-formed command line (enforcer/cli/daemon_args.py) comes here without
argparse, and this module imports only what the launch needs (`_socket`, not `socket`; json only to
read or print a report, or to write a session file whose values need escaping).
"""

from __future__ import annotations

import _socket
import os
import sys

from ..framing import FrameError, recv_frame, send_frame
from .exec_common import EXIT_REFUSED, print_report, refuse
from .launch_messages import LaunchReply, decode_launch_reply, decode_session_ended, encode_launch_request

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Mapping

    from .daemon_args import DaemonLaunch

STDIO = (0, 1, 2)  # handed to the daemon: the agent's stdin, stdout and stderr
PIDS_MAX_LIMIT = (1 << 32) - 1  # LaunchRequest.pids_max is a uint32


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


def _json_text(value: str) -> str:
    """value as json.dumps writes it (ensure_ascii): as is between quotes when nothing needs escaping."""
    if value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return f'"{value}"'
    import json

    return json.dumps(value)


def session_file_text(reply: LaunchReply) -> str:
    """What --session-file holds: json.dumps({"session": ..., "session_token": ...})."""
    return f'{{"session": {_json_text(reply.session)}, "session_token": {_json_text(reply.session_token)}}}'


def _write_session_file(fd: int, reply: LaunchReply) -> None:
    with os.fdopen(fd, "w") as f:
        f.write(session_file_text(reply))


def launch_via_daemon(parser: argparse.ArgumentParser, args: argparse.Namespace, command: list[str]) -> int:
    """The launch as argparse read it: every check and message of adl-exec's full command line."""
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
    agent = _agent(parser, args)
    if not 0 <= args.pids_max <= PIDS_MAX_LIMIT:
        parser.error(f"--pids-max {args.pids_max}: expected 0 to {PIDS_MAX_LIMIT}")
    environ = dict(os.environ)
    try:
        cwd = os.getcwd()
    except OSError as exc:
        return refuse(f"the working directory: {exc.strerror}")
    try:
        request = encode_launch_request(
            agent=agent,
            argv=command,
            environ=environ,
            cwd=cwd,
            accept_unenforced=list(args.accept_unenforced),
            pids_max=args.pids_max,
        )
    except UnicodeEncodeError:
        return refuse(_not_utf8(agent, command, environ, cwd))
    return launch(address, request, args.session_file, args.report, args.json)


def _not_utf8(agent: str, command: list[str], environ: dict[str, str], cwd: str) -> str:
    """Which text of the request cannot be sent: the launch socket's strings are UTF-8 (protobuf),
    and a name or value that is not (undecodable bytes, kept by Python as surrogates) is refused
    rather than altered."""

    def bad(text: str) -> bool:
        try:
            text.encode()
        except UnicodeEncodeError:
            return True
        return False

    names = [k for k, v in environ.items() if bad(k) or bad(v)]
    if bad(agent):
        what = "the agent's name"
    elif bad(cwd):
        what = f"the working directory {cwd!a}"
    elif any(bad(arg) for arg in command):
        what = f"argument {next(i for i, arg in enumerate(command) if bad(arg))} of the command"
    elif names:
        what = f"environment variable {names[0]!a}"
    else:
        what = "the request"
    return f"{what} is not valid UTF-8 (the daemon takes UTF-8 text only)"


def fast_launch(launch_args: DaemonLaunch, environ: Mapping[str, str]) -> int | None:
    """The launch daemon_args.read() accepted; None, before anything is opened or sent, where the
    request cannot be made (text that is not valid UTF-8, no working directory): adl-exec's full
    command line then refuses it with its message."""
    try:
        request = encode_launch_request(
            agent=launch_args.agent,
            argv=launch_args.command,
            environ=dict(environ),
            cwd=os.getcwd(),
            accept_unenforced=launch_args.accept_unenforced,
            pids_max=launch_args.pids_max,
        )
    except (ValueError, OSError):  # UnicodeEncodeError is a ValueError
        return None
    return launch(launch_args.address, request, launch_args.session_file, launch_args.report, launch_args.as_json)


def launch(
    address: str, request: bytes, session_file: str | os.PathLike[str] | None, report: bool, as_json: bool
) -> int:
    """Send the request with our stdio, wait for the session's end; the command's exit code, or
    EXIT_REFUSED."""
    session_fd = None
    if session_file:  # opened before the launch: a path that cannot be written refuses it
        try:
            session_fd = os.open(session_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        except OSError as exc:
            return refuse(f"--session-file {session_file}: {exc.strerror}")
    conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)  # close-on-exec, as socket.socket's
    try:
        try:
            conn.connect(address[len("unix:") :])
            send_frame(conn, request, STDIO)
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
            session_fd = None
        try:
            frame = recv_frame(conn)
        except (OSError, FrameError):
            frame = None
    finally:
        conn.close()
        if session_fd is not None:
            os.close(session_fd)
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
    if report:
        denials = {}
        if ended.kernel_denials_json:
            import json

            denials = json.loads(ended.kernel_denials_json)
        print_report(
            {
                "session": ended.session,
                "reason": ended.reason,
                "exit_code": ended.exit_code,
                "signal": ended.signal or None,
                "duration_ms": ended.duration_ms,
                "creations_refused": ended.creations_refused,
                "kernel_denials": denials,
            },
            as_json,
        )
    return ended.exit_code
