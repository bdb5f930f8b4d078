"""A tool runtime that runs each tool only when adl-enforcerd allows the call.

    @guarded(client, "lookup_invoice")
    def lookup_invoice(invoice_id: str) -> dict: ...

Before each call the wrapper asks Check with the tool's name and keyword arguments. ALLOW runs the
tool; ASK waits for a human (Approve / Reject on the admin socket) until the approval expires; DENY,
an expired approval, or any failure to reach the daemon raises ToolDenied and the tool never runs.
The obligations that come back (e.g. timeout_ms) are passed to the tool when it asks for them.

Try it against a running daemon holding the coding agent example:
    ADL_ENFORCER_SOCKET=/run/adl-enforcer/api.sock python examples/guarded_tools.py
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from enforcer.client import Client, Result

T = TypeVar("T")


class ToolDenied(Exception):
    def __init__(self, tool: str, result: Result) -> None:
        reasons = "; ".join(f"{r['rule']}: {r['text']}" for r in result.reasons) or "no reason given"
        super().__init__(f"{tool} denied ({result.decision_id or 'no decision id'}): {reasons}")
        self.result = result


def guarded(client: Client, tool: str, *, on_ask: Callable[[Result], None] | None = None) -> Callable[..., Any]:
    """Decorate a tool function whose keyword arguments are the tool call's JSON arguments."""

    def wrap(function: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(function)
        def call(**arguments: Any) -> T:
            result = client.check_tool(tool, arguments)
            if result.decision == "ASK":
                if on_ask is not None:
                    on_ask(result)
                result = client.wait_approval(result)
            if not result.allowed:
                raise ToolDenied(tool, result)
            return function(**arguments)

        return call

    return wrap


def main() -> int:
    client = Client(agent="Coding Agent")

    @guarded(client, "read_file")
    def read_file(path: str) -> str:
        return f"(contents of {path})"

    @guarded(client, "delete_path", on_ask=lambda r: print(f"waiting for a human: approval {r.approval_id}"))
    def delete_path(path: str) -> str:
        return f"deleted {path}"

    print(read_file(path="src/app.py"))
    for attempt in (lambda: read_file(path=42), lambda: delete_path(path="build/")):
        try:
            print(attempt())
        except ToolDenied as denied:
            print(f"refused: {denied}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
