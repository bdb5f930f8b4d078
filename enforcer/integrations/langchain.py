"""LangChain / LangGraph tools that run only when adl-enforcerd allows the call.

    from enforcer.integrations.langchain import guard_tool
    safe = guard_tool(lookup_invoice, Client(agent="invoice-processor"))
    safe.invoke({"invoice_id": "INV-1"})      # or inside a LangGraph ToolNode / agent

The guarded tool has the wrapped tool's name, description and argument schema. Its arguments are
parsed by that schema first, then checked (Check with the tool name and the parsed arguments):
ALLOW runs the wrapped tool; ASK waits for Approve / Reject on the admin socket (up to
approval_wait_s); DENY, an unapproved ASK or any failure raises ToolDenied, a ToolException, so
LangChain handles it as a tool error (with handle_tool_error=True the model sees the reason).
Invoked with a tool call, the ToolMessage's artifact carries the decision:
{"decision": "ALLOW", "decision_id": ..., "artifact": <the wrapped tool's artifact>}.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, ToolException
from pydantic import ConfigDict

from ..client import AsyncClient, Client, Result
from . import guard
from .guard import OnAsk, adecide, decide


class ToolDenied(guard.ToolDenied, ToolException):
    """LangChain's tool error, with the daemon's decision (the decorator's ToolDenied too)."""


class GuardedTool(BaseTool):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    client: Client
    async_client: AsyncClient | None = None
    approval_wait_s: float | None = None
    on_ask: OnAsk | None = None
    response_format: Literal["content", "content_and_artifact"] = "content_and_artifact"

    def _decided(self, result: Result, message: Any) -> tuple[Any, dict[str, Any]]:
        meta = {"decision": result.decision, "decision_id": result.decision_id}
        if isinstance(message, ToolMessage) and message.status == "error":
            raise ToolException(message.content)  # the wrapped tool's own handled error stays an error
        if isinstance(message, ToolMessage):
            return message.content, {**meta, "artifact": message.artifact}
        return message, {**meta, "artifact": None}

    def _call(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return {"type": "tool_call", "name": self.inner.name, "args": arguments, "id": f"adl-{uuid.uuid4().hex}"}

    def _run(self, config: RunnableConfig, **arguments: Any) -> tuple[Any, dict[str, Any]]:
        try:
            result = decide(self.client, self.name, arguments, on_ask=self.on_ask, approval_wait_s=self.approval_wait_s)
        except guard.ToolDenied as denied:
            raise ToolDenied(self.name, denied.result) from None
        return self._decided(result, self.inner.invoke(self._call(arguments), config))

    async def _arun(self, config: RunnableConfig, **arguments: Any) -> tuple[Any, dict[str, Any]]:
        try:
            result = await adecide(
                self.async_client or self.client,
                self.name,
                arguments,
                on_ask=self.on_ask,
                approval_wait_s=self.approval_wait_s,
            )
        except guard.ToolDenied as denied:
            raise ToolDenied(self.name, denied.result) from None
        return self._decided(result, await self.inner.ainvoke(self._call(arguments), config))


def guard_tool(
    tool: BaseTool,
    client: Client,
    *,
    async_client: AsyncClient | None = None,
    approval_wait_s: float | None = None,
    on_ask: OnAsk | None = None,
    handle_tool_error: bool = False,
) -> GuardedTool:
    """`tool`, asking adl-enforcerd before each call. async_client serves ainvoke (else `client` in a thread)."""
    return GuardedTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
        inner=tool,
        client=client,
        async_client=async_client,
        approval_wait_s=approval_wait_s,
        on_ask=on_ask,
        handle_tool_error=handle_tool_error,
    )
