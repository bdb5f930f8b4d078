"""adl-claude-hook: Claude Code's PreToolUse hook, answered by adl-enforcerd.

Claude Code runs the hook before each tool use with the event as JSON on stdin
({"hook_event_name": "PreToolUse", "tool_name": ..., "tool_input": {...}, "cwd": ..., ...}).
The hook maps the tool use to an ADL action, asks Check for the agent, and answers:

- ALLOW: exit 0 and {"hookSpecificOutput": {"hookEventName": "PreToolUse",
  "permissionDecision": "allow", "permissionDecisionReason": ...}} on stdout;
- DENY, or any failure (daemon unreachable, unreadable input): exit 2 with the reason on stderr,
  which Claude Code treats as a blocking error and shows to the model (the same decision is also
  printed on stdout as JSON, which Claude Code ignores with exit 2);
- ASK: waits for Approve / Reject on the daemon's admin socket up to --approval-wait, then answers
  allow or deny; with --ask=prompt it answers "ask" at once and Claude Code asks its own user
  (that answer is not recorded by the daemon, and the daemon's approval expires as a denial).

Mapping (docs/integrations.md has the full table and what it cannot see):
  Bash     -> exec of ["bash", "-c", command]: only "may this agent run a shell" is decided;
              the command line itself is not a policy
  Read     -> file read of file_path;  Write -> file write;  Edit, MultiEdit, NotebookEdit -> file read_write
  WebFetch -> network connect to the URL's host and port (protocol http or https)
  mcp__<server>__<tool> -> tool call <tool> with tool_input as the arguments
  any other tool -> tool call named as Claude Code names it (declare it in the ADL tools to allow it)

Register it in .claude/settings.json with a hook timeout above --approval-wait:
  {"hooks": {"PreToolUse": [{"matcher": "*", "hooks": [{"type": "command",
     "command": "adl-claude-hook --agent 'Coding Agent'", "timeout": 90}]}]}}
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from ..client import Client, Result, default_address
from ..v1 import enforcer_pb2 as pb

MAX_INPUT_BYTES = 64 * 1024 * 1024  # a Write's content travels in the event
DEFAULT_APPROVAL_WAIT_S = 50.0  # below Claude Code's default hook timeout (60 s)
EXIT_ALLOW = 0
EXIT_BLOCK = 2  # Claude Code: a blocking error; other non-zero codes let the tool run
FILE_MODES = {"Read": "read", "Write": "write", "Edit": "read_write", "MultiEdit": "read_write"}


class Unmapped(ValueError):
    """The tool use cannot be turned into an ADL action: refused without asking the daemon."""


@dataclass(frozen=True)
class Mapped:
    kind: str  # exec | file | network | tool
    action: Any  # a pb action message, or (name, arguments) for a tool call


def _path(tool_input: dict[str, Any], key: str, cwd: str) -> str:
    value = tool_input.get(key)
    if not isinstance(value, str) or not value:
        raise Unmapped(f"tool_input.{key} is missing")
    if value.startswith("~"):
        # Joined with cwd it would be checked as <cwd>/~/..., while a tool that expands it reads
        # the home directory: refused rather than checked for a path the tool might not use.
        raise Unmapped(f"tool_input.{key} {value!r} starts with '~', which a tool may read as a home directory")
    if not value.startswith("/"):
        if not cwd.startswith("/"):
            raise Unmapped(f"tool_input.{key} {value!r} is relative and cwd is not absolute")
        value = posixpath.join(cwd, value)
    return value


def map_tool_use(event: dict[str, Any], mcp_names: str = "tool") -> Mapped:
    """The ADL action that a PreToolUse event stands for."""
    tool = event.get("tool_name")
    tool_input = event.get("tool_input") if event.get("tool_input") is not None else {}
    cwd: str = event["cwd"] if isinstance(event.get("cwd"), str) else ""
    if not isinstance(tool, str) or not tool:
        raise Unmapped("tool_name is missing")
    if not isinstance(tool_input, dict):
        raise Unmapped("tool_input is not an object")
    if tool == "Bash":
        command = tool_input.get("command")
        if not isinstance(command, str):
            raise Unmapped("tool_input.command is missing")
        return Mapped("exec", pb.ProcessExec(argv=["bash", "-c", command]))
    if tool in FILE_MODES:
        return Mapped("file", pb.FileAccess(path=_path(tool_input, "file_path", cwd), mode=FILE_MODES[tool]))
    if tool == "NotebookEdit":
        return Mapped("file", pb.FileAccess(path=_path(tool_input, "notebook_path", cwd), mode="read_write"))
    if tool == "WebFetch":
        return Mapped("network", _connect(tool_input.get("url")))
    if tool.startswith("mcp__"):
        server, sep, name = tool[len("mcp__") :].partition("__")
        if not sep or not server or not name:
            raise Unmapped(f"{tool!r} is not mcp__<server>__<tool>")
        return Mapped("tool", (name if mcp_names == "tool" else tool, tool_input))
    return Mapped("tool", (tool, tool_input))


def _connect(url: Any) -> pb.NetworkConnect:
    if not isinstance(url, str):
        raise Unmapped("tool_input.url is missing")
    # Claude Code parses URLs as browsers do (WHATWG), Python as RFC 3986: they can name different
    # hosts for a backslash, whitespace, control characters or user info, so such a URL is refused
    # rather than checked for a host the fetch might not use.
    if not url.isascii() or not url.isprintable() or any(c in url for c in "\\ "):
        raise Unmapped(f"tool_input.url {url!r} has characters that URL parsers read differently")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise Unmapped(f"tool_input.url cannot be parsed: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise Unmapped(f"tool_input.url {url!r} is not an http(s) URL with a host")
    if "@" in parts.netloc:
        raise Unmapped(f"tool_input.url {url!r} carries user info")
    # WebFetch upgrades http to https; both are asked for what the URL names.
    return pb.NetworkConnect(host=parts.hostname, port=port or (443 if scheme == "https" else 80), protocol=scheme)


def answer(decision: str, reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": decision,
            "permissionDecisionReason": reason,
        }
    }


def _reason(result: Result) -> str:
    reasons = "; ".join(f"{r['rule']}: {r['text']}" for r in result.reasons) or "no reason given"
    return f"adl-enforcer {result.decision} ({result.decision_id or 'no decision id'}): {reasons}"


def decide(client: Client, event: dict[str, Any], args: argparse.Namespace) -> tuple[str, str]:
    """('allow' | 'deny' | 'ask', reason) for one PreToolUse event."""
    if event.get("hook_event_name", "PreToolUse") != "PreToolUse":
        return "deny", f"adl-claude-hook answers PreToolUse only, not {event.get('hook_event_name')!r}"
    try:
        mapped = map_tool_use(event, args.mcp_names)
    except Unmapped as exc:
        return "deny", f"adl-claude-hook cannot map this tool use to a policy action: {exc}"
    request_id: str = event["tool_use_id"] if isinstance(event.get("tool_use_id"), str) else ""
    if mapped.kind == "tool":
        name, arguments = mapped.action
        result = client.check_tool(name, arguments, request_id=request_id[:256])
    else:
        result = client.check_action(mapped.action, request_id=request_id[:256])
    if result.decision == "ASK" and result.approval_id:
        if args.ask == "prompt":
            return "ask", _reason(result)
        result = client.wait_approval(result, timeout_s=args.approval_wait)
    if result.allowed:
        return "allow", _reason(result)
    return "deny", _reason(result)


def run(args: argparse.Namespace, stdin: TextIO, stdout: TextIO, stderr: TextIO) -> int:
    try:
        decision, reason = _answer_event(args, stdin)
    except BaseException as exc:  # any exit but 2 lets Claude Code run the tool: every failure refuses
        decision, reason = "deny", f"adl-claude-hook failed: {type(exc).__name__}: {exc}"
    json.dump(answer(decision, reason), stdout)
    stdout.write("\n")
    if decision == "deny":
        print(reason, file=stderr)
        return EXIT_BLOCK
    return EXIT_ALLOW


def _answer_event(args: argparse.Namespace, stdin: TextIO) -> tuple[str, str]:
    try:
        raw = stdin.read(MAX_INPUT_BYTES + 1)
        if len(raw) > MAX_INPUT_BYTES:
            raise ValueError(f"the event is larger than {MAX_INPUT_BYTES} bytes")
        event = json.loads(raw)
        if not isinstance(event, dict):
            raise ValueError("the event is not a JSON object")
    except ValueError as exc:
        decision, reason = "deny", f"adl-claude-hook cannot read the hook event: {exc}"
    else:
        with Client(args.socket or default_address(), agent=args.agent, deadline_s=args.deadline) as client:
            decision, reason = decide(client, event, args)
    return decision, reason


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="adl-claude-hook",
        description="Claude Code PreToolUse hook: ask adl-enforcerd whether the agent may use the tool. "
        "Reads the hook event on stdin; exit 0 with a JSON allow (or ask), exit 2 with the reason on stderr.",
    )
    parser.add_argument("--agent", required=True, help="the agent (name or id) whose policy decides")
    parser.add_argument("--socket", default=os.environ.get("ADL_ENFORCER_SOCKET", ""), help="the daemon's API socket")
    parser.add_argument(
        "--ask",
        choices=("wait", "prompt"),
        default="wait",
        help="ASK: wait for Approve/Reject on the daemon (default), or answer 'ask' and let Claude Code prompt",
    )
    parser.add_argument(
        "--approval-wait",
        type=float,
        default=DEFAULT_APPROVAL_WAIT_S,
        metavar="S",
        help="with --ask=wait: how long to wait (keep it below the hook's timeout; default %(default)s)",
    )
    parser.add_argument(
        "--mcp-names",
        choices=("tool", "full"),
        default="tool",
        help="the ADL tool name for mcp__<server>__<tool>: <tool> (default) or the full name",
    )
    parser.add_argument("--deadline", type=float, default=2.0, help="seconds for each call to the daemon")
    args = parser.parse_args(argv)
    if args.socket and ":" not in args.socket:
        args.socket = f"unix:{args.socket}"
    return args


def _refuse_on_term(signum: int, frame: Any) -> None:
    # Stopped before it answered (the hook's timeout): a blocking answer, not an error Claude Code
    # would treat as "go ahead".
    os.write(2, b"adl-claude-hook was stopped before the daemon answered: refused\n")
    os._exit(EXIT_BLOCK)


def main(argv: Sequence[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _refuse_on_term)
    signal.signal(signal.SIGINT, _refuse_on_term)
    return run(parse_args(argv), sys.stdin, sys.stdout, sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
