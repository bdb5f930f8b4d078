"""LangChain tools and the guarded decorator, sync and async, against a real daemon."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("langchain_core")

from langchain_core.messages import ToolMessage
from langchain_core.tools import ToolException, tool

from enforcer.client import AsyncClient, Client
from enforcer.integrations.guard import Guarded, ToolDenied, guarded
from enforcer.integrations.langchain import guard_tool
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.daemon import RunningDaemon, daemon  # noqa: F401 (fixture)

RAN: list[str] = []


@tool
def read_note(name: str, count: int = 1) -> str:
    """Read a note."""
    RAN.append(f"read_note {name}")
    return f"note {name} x{count}"


@tool
def delete_note(name: str) -> str:
    """Delete a note."""
    RAN.append(f"delete_note {name}")
    return f"deleted {name}"


@tool
def shell(command: str) -> str:
    """Run a command."""
    RAN.append(f"shell {command}")
    return "ran"


@tool
def pay(amount: float) -> str:
    """Move money; fails on its own for negative amounts."""
    if amount < 0:
        raise ToolException("negative amount")
    RAN.append(f"pay {amount}")
    return "paid"


pay.handle_tool_error = True


@pytest.fixture
def client(daemon: RunningDaemon) -> Iterator[Client]:  # noqa: F811
    RAN.clear()
    with Client(f"unix:{daemon.api}", agent="Sandboxed") as c:
        yield c


class Approver:
    """Approves (or rejects) the next pending approval of the agent, from another thread."""

    def __init__(self, d: RunningDaemon, approve: bool = True, only: str = "") -> None:
        self.admin = d.admin_stub()
        self.approve = approve
        self.only = only  # decide only an approval whose (masked) arguments contain this
        self.decided: list[str] = []
        self.thread = threading.Thread(target=self.run)

    def run(self) -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for pending in self.admin.ListPending(pb.ListPendingRequest(agent="Sandboxed")).pending:
                if self.only not in pending.arguments_json:
                    continue
                decision = pb.ApprovalDecision(approval_id=pending.approval_id, approver="alice")
                (self.admin.Approve if self.approve else self.admin.Reject)(decision)
                self.decided.append(pending.decision_id)
                return
            time.sleep(0.05)

    def __enter__(self) -> Approver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.thread.join(25)


def test_langchain_tool_allowed_denied_and_asked(daemon: RunningDaemon, client: Client) -> None:  # noqa: F811
    safe_read, safe_delete, safe_shell = (guard_tool(t, client) for t in (read_note, delete_note, shell))
    assert (safe_read.name, safe_read.args) == (read_note.name, read_note.args)

    # Allowed: the tool runs; invoked with a tool call, the artifact carries the decision id.
    message = safe_read.invoke({"type": "tool_call", "name": "read_note", "args": {"name": "a"}, "id": "call-1"})
    assert isinstance(message, ToolMessage) and message.content == "note a x1"
    decision_id = message.artifact["decision_id"]
    assert message.artifact["decision"] == "ALLOW" and decision_id
    record = next(r for r in daemon.records() if r["payload"].get("decision_id") == decision_id)
    assert record["payload"]["decision"] == "allow"
    assert safe_read.invoke({"name": "b", "count": 2}) == "note b x2"

    # Denied: LangChain's own ToolException, and the tool never ran.
    with pytest.raises(ToolException) as denied:
        safe_shell.invoke({"command": "id"})
    assert "tool.undeclared" in str(denied.value) and denied.value.decision_id  # type: ignore[attr-defined]
    handled = guard_tool(shell, client, handle_tool_error=True)
    answer = handled.invoke({"type": "tool_call", "name": "shell", "args": {"command": "id"}, "id": "call-2"})
    assert answer.status == "error" and "tool.undeclared" in answer.content

    # The wrapped tool's own handled error stays an error (not a success carrying its message).
    with pytest.raises(ToolException, match="negative amount"):
        guard_tool(pay, client).invoke({"amount": -1})
    answer = guard_tool(pay, client, handle_tool_error=True).invoke(
        {"type": "tool_call", "name": "pay", "args": {"amount": -1}, "id": "call-3"}
    )
    assert answer.status == "error" and answer.content == "negative amount"

    # Asked: waits for the approval, then runs; rejected: refused.
    with Approver(daemon) as approver:
        assert safe_delete.invoke({"name": "old"}) == "deleted old"
    assert approver.decided
    with Approver(daemon, approve=False), pytest.raises(ToolException) as rejected:
        safe_delete.invoke({"name": "older"})
    assert "older" not in " ".join(RAN) and "DENY" in str(rejected.value)
    assert RAN == ["read_note a", "read_note b", "delete_note old"]


def test_langchain_tool_async(daemon: RunningDaemon, client: Client) -> None:  # noqa: F811
    async def run() -> None:
        async with AsyncClient(f"unix:{daemon.api}", agent="Sandboxed") as aclient:
            safe_read = guard_tool(read_note, client, async_client=aclient)
            assert await safe_read.ainvoke({"name": "a"}) == "note a x1"
            with pytest.raises(ToolException, match=r"tool\.undeclared"):
                await guard_tool(shell, client, async_client=aclient).ainvoke({"command": "id"})
            with Approver(daemon):
                message = await guard_tool(delete_note, client, async_client=aclient).ainvoke(
                    {"type": "tool_call", "name": "delete_note", "args": {"name": "old"}, "id": "c"}
                )
            assert message.content == "deleted old" and message.artifact["decision"] == "ALLOW"
            # Without an async client the sync one runs in a worker thread.
            assert await guard_tool(read_note, client).ainvoke({"name": "t"}) == "note t x1"

    asyncio.run(run())
    assert RAN == ["read_note a", "delete_note old", "read_note t"]


def test_decorator_sync_and_async(daemon: RunningDaemon, client: Client) -> None:  # noqa: F811
    @guarded(client, "read_note", with_decision=True)
    def read(name: str) -> str:
        RAN.append(f"read {name}")
        return name.upper()

    @guarded(client, "delete_note", approval_wait_s=1)
    def delete(name: str) -> str:
        RAN.append(f"delete {name}")
        return name

    done = read(name="x")
    assert isinstance(done, Guarded) and done.value == "X" and done.decision_id
    with pytest.raises(ToolDenied, match=r"tool\.args_invalid"):
        read(name=5)
    started = time.monotonic()
    with pytest.raises(ToolDenied, match="ASK"):  # nobody approves within approval_wait_s
        delete(name="y")
    assert time.monotonic() - started < 10

    async def run() -> Guarded[str]:
        async with AsyncClient(f"unix:{daemon.api}", agent="Sandboxed") as aclient:

            @guarded(aclient, "delete_note", approval_wait_s=20, with_decision=True)
            async def adelete(name: str) -> str:
                RAN.append(f"adelete {name}")
                return name

            @guarded(aclient, "pay")  # returns the plain value
            async def apay(amount: float) -> str:
                RAN.append("apay")
                return "paid"

            with pytest.raises(ToolDenied, match=r"tool\.args_invalid"):
                await apay(amount="lots")
            with pytest.raises(TypeError):  # a sync tool needs a sync client
                guarded(aclient, "read_note")(lambda name: name)
            with Approver(daemon, only='"z"'):
                return await adelete(name="z")

    adone = asyncio.run(run())
    assert adone.value == "z" and adone.result.decision == "ALLOW"
    assert RAN == ["read x", "adelete z"]
