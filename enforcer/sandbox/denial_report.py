"""The --report lines on a session's kernel denials, from the summary the session records.

Apart from denials.py, which imports the audit package and the policy code: `adl-exec --daemon
--report` prints these lines from the summary the daemon sends and imports nothing else for them.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def report_lines(summary: dict[str, Any]) -> list[str]:
    """adl-exec --report: a few lines on the session's kernel denials."""
    if not summary.get("available"):
        return [f"kernel denials: unavailable ({summary.get('why')})"]
    lines = []
    if summary.get("reader_error"):
        lines.append(f"kernel denials: the reader failed ({summary['reader_error']}): the count is incomplete")
    if summary.get("landlock"):
        lines.append(f"kernel denials: Landlock {summary['landlock']}")
    if not summary["denials"]:
        return [*lines, "kernel denials: none"]
    lines.append(f"kernel denials: {summary['denials']} ({summary['recorded']} recorded one by one in the audit log)")
    for item in summary["top"][:5]:
        what = item.get("path") or (f"port {item['port']}" if item.get("port") else item.get("syscall"))
        lines.append(f"  {item['count']:>6} x {item.get('access')} {what} by {item.get('command')}: {item.get('hint')}")
    if summary.get("lost_in_kernel_socket"):
        lines.append(f"  ({summary['lost_in_kernel_socket']} kernel messages lost to a full socket buffer)")
    if summary.get("lost_in_kernel_queue"):
        lines.append(f"  (the kernel dropped {summary['lost_in_kernel_queue']} audit records meanwhile: flood)")
    return lines
