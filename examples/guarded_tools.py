"""A tool runtime that runs each tool only when adl-enforcerd allows the call.

    @guarded(client, "lookup_invoice")
    def lookup_invoice(invoice_id: str) -> dict: ...

    @guarded(async_client, "lookup_invoice")
    async def lookup_invoice(invoice_id: str) -> dict: ...

Before each call the wrapper asks Check with the tool's name and keyword arguments. ALLOW runs the
tool; ASK waits for a human (Approve / Reject on the admin socket) until the approval expires; DENY,
an expired approval, or any failure to reach the daemon raises ToolDenied and the tool never runs.
With with_decision=True a guarded call returns Guarded(value, result), whose decision_id names its
audit record; otherwise it returns the tool's value.
(enforcer.integrations.guard holds the decorator; enforcer.integrations.langchain wraps LangChain tools.)

Try it against a running daemon holding the coding agent example:
    ADL_ENFORCER_SOCKET=/run/adl-enforcer/api.sock python examples/guarded_tools.py
"""

from __future__ import annotations

import asyncio
import sys

from enforcer.client import AsyncClient, Client
from enforcer.integrations.guard import ToolDenied, guarded

__all__ = ["ToolDenied", "guarded"]


def main() -> int:
    client = Client(agent="Coding Agent")

    @guarded(client, "read_file", with_decision=True)
    def read_file(path: str) -> str:
        return f"(contents of {path})"

    @guarded(client, "delete_path", on_ask=lambda r: print(f"waiting for a human: approval {r.approval_id}"))
    def delete_path(path: str) -> str:
        return f"deleted {path}"

    done = read_file(path="src/app.py")
    print(f"{done.value} [{done.decision_id}]")
    for attempt in (lambda: read_file(path=42), lambda: delete_path(path="build/")):
        try:
            print(attempt())
        except ToolDenied as denied:
            print(f"refused: {denied}")

    async def read_async() -> None:
        async with AsyncClient(agent="Coding Agent") as aclient:

            @guarded(aclient, "read_file")
            async def aread_file(path: str) -> str:
                return f"(contents of {path}, read asynchronously)"

            print(await aread_file(path="README.md"))

    asyncio.run(read_async())
    return 0


if __name__ == "__main__":
    sys.exit(main())
