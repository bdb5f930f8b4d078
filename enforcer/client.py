"""Client library for adl-enforcerd's decision API, sync (Client) and asyncio (AsyncClient).

Every failure is a DENY: an unreachable daemon, a deadline, an UNAVAILABLE audit log, a bad request.
A `Result` never raises and says why in `reasons` (rule `client.error` with the gRPC status).

    client = Client(agent="invoice-processor")
    result = client.check_tool("lookup_invoice", {"invoice_id": "INV-1"})
    if result.decision == "ASK":
        result = client.wait_approval(result)
    if result.allowed:
        ...run the tool...
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import grpc
import orjson

from .v1 import enforcer_pb2 as pb
from .v1 import enforcer_pb2_grpc as pb_grpc

DEFAULT_DEADLINE_S = 2.0
Action = pb.ProcessExec | pb.FileAccess | pb.NetworkConnect | pb.EnvVar
_NAMES = {pb.ALLOW: "ALLOW", pb.DENY: "DENY", pb.ASK: "ASK"}


def default_address() -> str:
    return "unix:" + os.environ.get("ADL_ENFORCER_SOCKET", "/run/adl-enforcer/api.sock")


@dataclass(frozen=True)
class Result:
    decision: str  # ALLOW | DENY | ASK
    reasons: list[dict[str, str]] = field(default_factory=list)
    obligations: dict[str, Any] = field(default_factory=dict)
    decision_id: str = ""
    approval_id: str = ""
    approval_expires_unix_ms: int = 0
    audit_seq: int = 0
    error: str | None = None  # set when the DENY comes from a failed call, not from the policy

    @property
    def allowed(self) -> bool:
        return self.decision == "ALLOW"

    @staticmethod
    def from_response(response: pb.CheckResponse) -> Result:
        return Result(
            decision=_NAMES.get(response.decision, "DENY"),
            reasons=[
                {"rule": r.rule, "pointer": r.pointer, "document": r.document, "text": r.text} for r in response.reasons
            ],
            obligations=orjson.loads(response.obligations_json) if response.obligations_json else {},
            decision_id=response.decision_id,
            approval_id=response.approval_id,
            approval_expires_unix_ms=response.approval_expires_unix_ms,
            audit_seq=response.receipt.seq if response.HasField("receipt") else 0,
        )

    @staticmethod
    def failure(error: str) -> Result:
        return Result(
            "DENY", [{"rule": "client.error", "pointer": "", "document": "enforcer", "text": error}], error=error
        )


def _describe(exc: Exception) -> str:
    if isinstance(exc, grpc.RpcError):
        code = exc.code()
        return f"{code.name if code else 'UNKNOWN'}: {exc.details()}"
    return f"{type(exc).__name__}: {exc}"


class _Base:
    """What the sync and asyncio clients share: identity, deadline and request building."""

    _open_channel: Any  # grpc.insecure_channel or grpc.aio.insecure_channel

    def __init__(
        self,
        address: str | None = None,
        *,
        agent: str | None = None,
        session: str | None = None,
        session_token: str | None = None,
        deadline_s: float = DEFAULT_DEADLINE_S,
    ) -> None:
        channel = type(self)._open_channel(address or default_address())
        self._channel = channel
        self._stub = pb_grpc.EnforcerStub(channel)
        self.agent = agent or ""
        self.session = session or ""
        self.session_token = session_token or ""
        self.deadline_s = deadline_s

    def _tool_request(
        self, name: str, arguments: Any, request_id: str = "", traceparent: str = "", dry_run: bool = False
    ) -> pb.CheckRequest | Result:
        """The request, or the DENY to return when the arguments cannot be sent."""
        try:
            args = orjson.dumps({} if arguments is None else arguments).decode()
        except TypeError as exc:
            return Result.failure(f"tool arguments are not JSON: {exc}")
        return pb.CheckRequest(
            request_id=request_id,
            agent=self.agent,
            session=self.session,
            session_token=self.session_token,
            tool=pb.ToolCall(name=name, arguments_json=args),
            trace=pb.TraceContext(traceparent=traceparent) if traceparent else None,
            mode=pb.DRY_RUN if dry_run else pb.ENFORCE,
        )

    def _action_request(
        self, action: Action, request_id: str = "", traceparent: str = "", dry_run: bool = False
    ) -> pb.CheckRequest:
        """A request for an action other than a tool call (exec, file, network, env)."""
        which = {pb.ProcessExec: "exec", pb.FileAccess: "file", pb.NetworkConnect: "network", pb.EnvVar: "env"}
        return pb.CheckRequest(
            request_id=request_id,
            agent=self.agent,
            session=self.session,
            session_token=self.session_token,
            trace=pb.TraceContext(traceparent=traceparent) if traceparent else None,
            mode=pb.DRY_RUN if dry_run else pb.ENFORCE,
            **{which[type(action)]: action},
        )

    def _explain_request(self) -> pb.CheckRequest:
        # Explain decides an action too (dry run, recorded): a tool call nothing declares.
        return pb.CheckRequest(
            agent=self.agent,
            session=self.session,
            session_token=self.session_token,
            tool=pb.ToolCall(name="adl-enforcer/explain", arguments_json="{}"),
            mode=pb.DRY_RUN,
        )

    def _wait_request(self, pending: Result, limit_s: float | None) -> tuple[pb.WaitApprovalRequest, float]:
        """WaitApproval until the approval expires (or limit_s), and the call's deadline."""
        wait_ms = pending.approval_expires_unix_ms - int(time.time() * 1000) + 500
        if limit_s is not None:
            wait_ms = min(wait_ms, int(limit_s * 1000))
        wait_ms = max(wait_ms, 0)
        request = pb.WaitApprovalRequest(
            approval_id=pending.approval_id, wait_ms=wait_ms, session=self.session, session_token=self.session_token
        )
        return request, wait_ms / 1000 + self.deadline_s


def _is_pending(result: Result) -> bool:
    return result.decision == "ASK" and bool(result.approval_id)


class Client(_Base):
    _open_channel = staticmethod(grpc.insecure_channel)

    def check(self, request: pb.CheckRequest) -> Result:
        try:
            return Result.from_response(self._stub.Check(request, timeout=self.deadline_s))
        except Exception as exc:  # every failure is a denial
            return Result.failure(_describe(exc))

    def check_tool(self, name: str, arguments: Any = None, **kw: Any) -> Result:
        request = self._tool_request(name, arguments, **kw)
        return request if isinstance(request, Result) else self.check(request)

    def check_action(self, action: Action, **kw: Any) -> Result:
        """Check a pb.ProcessExec, pb.FileAccess, pb.NetworkConnect or pb.EnvVar."""
        return self.check(self._action_request(action, **kw))

    def policy_summary(self) -> dict[str, Any] | None:
        """The agent's effective policy as `adl-policy explain` prints it; None if it cannot be had."""
        try:
            return orjson.loads(self._stub.Explain(self._explain_request(), timeout=self.deadline_s).policy_json)
        except Exception:
            return None

    def wait_approval(self, pending: Result, timeout_s: float | None = None) -> Result:
        """Wait for a human to decide an ASK (until it expires, or timeout_s); still pending -> ASK."""
        if not _is_pending(pending):
            return pending
        request, deadline = self._wait_request(pending, timeout_s)
        try:
            return Result.from_response(self._stub.WaitApproval(request, timeout=deadline))
        except Exception as exc:
            return Result.failure(_describe(exc))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient(_Base):
    _open_channel = staticmethod(grpc.aio.insecure_channel)

    async def check(self, request: pb.CheckRequest) -> Result:
        try:
            return Result.from_response(await self._stub.Check(request, timeout=self.deadline_s))
        except Exception as exc:
            return Result.failure(_describe(exc))

    async def check_tool(self, name: str, arguments: Any = None, **kw: Any) -> Result:
        request = self._tool_request(name, arguments, **kw)
        return request if isinstance(request, Result) else await self.check(request)

    async def check_action(self, action: Action, **kw: Any) -> Result:
        return await self.check(self._action_request(action, **kw))

    async def policy_summary(self) -> dict[str, Any] | None:
        try:
            response = await self._stub.Explain(self._explain_request(), timeout=self.deadline_s)
            return orjson.loads(response.policy_json)
        except Exception:
            return None

    async def wait_approval(self, pending: Result, timeout_s: float | None = None) -> Result:
        if not _is_pending(pending):
            return pending
        request, deadline = self._wait_request(pending, timeout_s)
        try:
            return Result.from_response(await self._stub.WaitApproval(request, timeout=deadline))
        except Exception as exc:
            return Result.failure(_describe(exc))

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
