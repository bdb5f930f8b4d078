"""Run a tool only when adl-enforcerd allows the call: the decision logic every wrapper shares.

    @guarded(client, "lookup_invoice")
    def lookup_invoice(invoice_id: str) -> dict: ...

    @guarded(async_client, "lookup_invoice")
    async def lookup_invoice(invoice_id: str) -> dict: ...

Before each call the wrapper asks Check with the tool's name and keyword arguments. ALLOW runs the
tool; ASK waits for a human (Approve / Reject on the admin socket) until the approval expires or
`approval_wait_s`; DENY, an expired approval, or any failure to reach the daemon raises ToolDenied
and the tool never runs. With with_decision=True a guarded function returns Guarded(value, result):
the tool's value and the decision (its decision_id names the audit record); otherwise the value.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ..client import AsyncClient, Client, Result

T = TypeVar("T")


class ToolDenied(Exception):
    """The daemon did not allow the call (DENY, an ASK nobody approved in time, or a failure)."""

    def __init__(self, tool: str, result: Result) -> None:
        super().__init__(describe(tool, result))
        self.tool = tool
        self.result = result

    @property
    def decision_id(self) -> str:
        return self.result.decision_id


def describe(tool: str, result: Result) -> str:
    reasons = "; ".join(f"{r['rule']}: {r['text']}" for r in result.reasons) or "no reason given"
    return f"{tool} refused by adl-enforcer ({result.decision} {result.decision_id or 'no decision id'}): {reasons}"


@dataclass(frozen=True)
class Guarded(Generic[T]):
    value: T
    result: Result

    @property
    def decision_id(self) -> str:
        return self.result.decision_id


OnAsk = Callable[[Result], None]


def _final(tool: str, result: Result) -> Result:
    if not result.allowed:
        raise ToolDenied(tool, result)
    return result


def decide(
    client: Client, tool: str, arguments: Any, *, on_ask: OnAsk | None = None, approval_wait_s: float | None = None
) -> Result:
    """The ALLOW that lets the call run; raises ToolDenied otherwise."""
    result = client.check_tool(tool, arguments)
    if result.decision == "ASK":
        if on_ask is not None:
            on_ask(result)
        result = client.wait_approval(result, timeout_s=approval_wait_s)
    return _final(tool, result)


async def adecide(
    client: AsyncClient | Client,
    tool: str,
    arguments: Any,
    *,
    on_ask: OnAsk | None = None,
    approval_wait_s: float | None = None,
) -> Result:
    """decide() for asyncio: with a sync Client the calls run in a worker thread."""
    if isinstance(client, Client):
        return await asyncio.to_thread(decide, client, tool, arguments, on_ask=on_ask, approval_wait_s=approval_wait_s)
    result = await client.check_tool(tool, arguments)
    if result.decision == "ASK":
        if on_ask is not None:
            on_ask(result)
        result = await client.wait_approval(result, timeout_s=approval_wait_s)
    return _final(tool, result)


def guarded(
    client: Client | AsyncClient,
    tool: str,
    *,
    on_ask: OnAsk | None = None,
    approval_wait_s: float | None = None,
    with_decision: bool = False,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorate a tool function (sync or async) whose keyword arguments are the call's JSON arguments."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.iscoroutinefunction(function):

            @functools.wraps(function)
            async def acall(**arguments: Any) -> Any:
                result = await adecide(client, tool, arguments, on_ask=on_ask, approval_wait_s=approval_wait_s)
                value = await function(**arguments)
                return Guarded(value, result) if with_decision else value

            return acall
        if not isinstance(client, Client):
            raise TypeError(f"{tool}: a sync function needs a sync Client")

        @functools.wraps(function)
        def call(**arguments: Any) -> Any:
            result = decide(client, tool, arguments, on_ask=on_ask, approval_wait_s=approval_wait_s)
            value = function(**arguments)
            return Guarded(value, result) if with_decision else value

        return call

    return wrap


__all__ = ["Guarded", "ToolDenied", "adecide", "decide", "describe", "guarded"]
