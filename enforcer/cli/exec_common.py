"""What adl-exec's launch paths share (embedded, daemon): the refusal exit code and the --report
output. Kept apart from enforcer/cli/exec.py so that neither path imports the entry point that
imports it; light, because `adl-exec --daemon` imports it (json only when --report needs it)."""

from __future__ import annotations

import sys

TYPE_CHECKING = False  # typing's own import is a noticeable part of the daemon client's start-up
if TYPE_CHECKING:
    from typing import Any

EXIT_REFUSED = 125


def refuse(message: str) -> int:
    """Print why, with control characters escaped: refusals carry names the caller, the agent or the
    daemon chose (paths, the daemon's reason, the agent's last words in a session's end)."""
    from ..text import printable

    print(f"adl-exec: refused: {printable(message)}", file=sys.stderr)
    return EXIT_REFUSED


def print_report(report: dict[str, Any], as_json: bool) -> None:
    """--report: the session's typed outcome on stderr (embedded and daemon mode alike)."""
    if as_json:
        import json

        print(json.dumps(report), file=sys.stderr)
        return
    extra = f", signal {report['signal']}" if report["signal"] else ""
    if report["creations_refused"]:
        extra += f", {report['creations_refused']} denied name(s) not created"
    print(
        f"adl-exec: {report['session']} ended: {report['reason']} (exit code {report['exit_code']}{extra}, "
        f"{report['duration_ms']} ms)",
        file=sys.stderr,
    )
    if report.get("kernel_denials"):
        from ..sandbox.denial_report import report_lines
        from ..text import printable  # the lines carry the agent's command name and paths

        for line in report_lines(report["kernel_denials"]):
            print(f"adl-exec: {printable(line)}", file=sys.stderr)
    if report.get("audit_dir"):
        where = f"{report['audit_dir']} (adl-audit search --session {report['session']})"
        print(f"adl-exec: audit log: {where}", file=sys.stderr)
