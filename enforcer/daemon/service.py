"""The gRPC services: Enforcer (Check, CheckBatch, Explain, WaitApproval, Status) and Admin.

Every answer is sent after its audit record is appended; a record that cannot be written makes the
call fail with UNAVAILABLE (the client library turns that into DENY). A policy denial is a
successful call. Requests are parsed by a tolerant deserializer so that a malformed or oversized
message gets INVALID_ARGUMENT from us rather than an INTERNAL error from the framework.

This module is the gRPC plumbing; the decisions, approvals and their records are core.py's, and
the conversion between messages and policy types is messages.py's.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import orjson

from .. import data
from ..explain import explained
from ..policy import presets
from ..v1 import enforcer_pb2 as pb
from .approvals import Approval
from .callers import ROOT
from .core import Core
from .inline import Answer, PeerBatchHandler
from .launch import Caller
from .messages import (
    ApiError,
    Malformed,
    approval_message,
    bounded_text,
    error_answer,
    masked_sessions,
    parse_or_error,
    raised,
    receipt_message,
    tolerant,
)

MAX_BATCH = 256
MAX_WAIT_MS = 600_000
_PRESET_LINES_MAX = 256  # Explain's preset lines remembered; reloads and catalog changes leave old ones, all dropped
_STATUS = grpc.StatusCode


class EnforcerService:
    """enforcer.v1.Enforcer"""

    def __init__(
        self,
        core: Core,
        status: Callable[[], pb.StatusResponse],
        max_waits: int = 256,
        *,
        admin: bool = False,
        presets_catalog: Path = data.PRESETS,
    ) -> None:
        self.core = core
        self._status = status
        self.admin = admin  # on the admin socket (root only): every caller is root
        self.presets_catalog = presets_catalog  # the one the daemon's launches read
        # What each document's presets grant, by (its documents' digest, the catalog file's identity):
        # reading the catalog takes milliseconds, and Explain is charged as one Check.
        self._preset_lines: dict[tuple[str, tuple[int, int, int, int, int]], list[str]] = {}
        # The server has this many threads beyond its workers: waits never take the ones that answer.
        self._waits = threading.BoundedSemaphore(max_waits)
        self.max_waits = max_waits
        # One uid gets a quarter of the waits: it cannot leave every other agent's WaitApproval refused.
        self.max_waits_per_uid = max(1, max_waits // 4)
        self._waits_of: dict[int, int] = {}
        self._waits_lock = threading.Lock()

    def _who(self, context: grpc.ServicerContext) -> Caller:
        return ROOT if self.admin else self.core.who(context.peer())

    def Check(self, request: pb.CheckRequest, context: grpc.ServicerContext) -> pb.CheckResponse:
        return self.core.check(request, self._who(context))

    def CheckBatch(self, request: pb.CheckBatchRequest, context: grpc.ServicerContext) -> pb.CheckBatchResponse:
        return self.check_batch(request, self._who(context))

    def check_batch(self, request: pb.CheckBatchRequest, who: Caller) -> pb.CheckBatchResponse:
        if len(request.requests) > MAX_BATCH:
            raise ApiError(_STATUS.INVALID_ARGUMENT, f"at most {MAX_BATCH} requests in a batch")
        return pb.CheckBatchResponse(responses=self.core.check_batch(request.requests, who))

    def Explain(self, request: pb.CheckRequest, context: grpc.ServicerContext) -> pb.ExplainResponse:
        who = self._who(context)
        entry, session = self.core.caller(request.agent, request.session, request.session_token, who)
        decision = self.core.decide_for(entry, session, request, dry_run=True, who=who)
        shown = explained(entry.policy, self._presets_granted(entry.adl_document, entry.source_digest))
        return pb.ExplainResponse(decision=decision, policy_json=orjson.dumps(shown).decode())

    def _presets_granted(self, adl_document: dict[str, Any], source_digest: str) -> list[str]:
        """The lines `adl-policy explain` shows for the runtime presets the document enables, from
        the catalog the daemon's launches use."""
        try:
            if not presets.requested(adl_document):
                return []
        except presets.PresetError:
            pass  # explain_lines says why a launch refuses it
        from ..sandbox import runtime_presets  # only documents that ask for presets need the catalog

        try:
            st = os.stat(self.presets_catalog)
        except OSError:
            return runtime_presets.explain_lines(adl_document, self.presets_catalog)  # says why it is refused
        # ctime too: a file rewritten in place to its old size with its mtime put back (cp -p,
        # touch -r) keeps every other member, and no one can set ctime back.
        key = (source_digest, (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size))
        lines = self._preset_lines.get(key)
        if lines is None:
            if len(self._preset_lines) >= _PRESET_LINES_MAX:
                self._preset_lines.clear()
            lines = self._preset_lines[key] = runtime_presets.explain_lines(adl_document, self.presets_catalog)
        return lines

    def WaitApproval(self, request: pb.WaitApprovalRequest, context: grpc.ServicerContext) -> pb.CheckResponse:
        approval = self.core.approvals.get(request.approval_id)
        if approval is None:
            raise ApiError(_STATUS.NOT_FOUND, f"no approval {request.approval_id!r}")
        who = self._who(context)
        if approval.uid is not None and who.uid not in (0, approval.uid):
            raise ApiError(_STATUS.PERMISSION_DENIED, "this approval was asked for by another uid")
        if approval.session and (
            request.session != approval.session
            or self.core.registry.authenticate(request.session, request.session_token) is None
        ):
            raise ApiError(_STATUS.UNAUTHENTICATED, "this approval belongs to a session; give its id and token")
        wait_s = min(request.wait_ms, MAX_WAIT_MS) / 1000
        remaining = context.time_remaining()
        if remaining is not None:
            wait_s = min(wait_s, max(remaining - 0.05, 0))
        if wait_s > 0:
            with self._waits_lock:
                if self._waits_of.get(who.uid, 0) >= self.max_waits_per_uid:
                    raise ApiError(
                        _STATUS.RESOURCE_EXHAUSTED,
                        f"{self.max_waits_per_uid} WaitApproval calls of uid {who.uid} are already waiting; retry",
                    )
                if not self._waits.acquire(blocking=False):
                    raise ApiError(
                        _STATUS.RESOURCE_EXHAUSTED, f"{self.max_waits} WaitApproval calls are already waiting; retry"
                    )
                self._waits_of[who.uid] = self._waits_of.get(who.uid, 0) + 1
            try:
                # Only the approval's own caller cancels it by leaving; anyone else merely stops waiting.
                owner = bool(approval.session) or (approval.uid is not None and who.uid == approval.uid)
                approval = self._wait_while_connected(request.approval_id, wait_s, context, owner) or approval
            finally:
                with self._waits_lock:
                    left = self._waits_of[who.uid] - 1
                    if left:
                        self._waits_of[who.uid] = left
                    else:
                        del self._waits_of[who.uid]
                self._waits.release()
        return self.core.approval_response(approval)

    def _wait_while_connected(
        self, approval_id: str, wait_s: float, context: grpc.ServicerContext, owner: bool
    ) -> Approval | None:
        """Wait in slices; a waiter that went away (cancelled, disconnected) cancels its approval, so
        nobody can approve a call whose runtime is no longer there to run it."""
        deadline = time.monotonic() + wait_s
        while True:
            approval = self.core.approvals.wait(approval_id, min(0.25, max(deadline - time.monotonic(), 0)))
            done = approval is None or approval.outcome != "pending" or self.core.approvals.closed
            if done or time.monotonic() >= deadline:
                return approval
            if not context.is_active():
                if not owner:
                    return approval
                with contextlib.suppress(ApiError):
                    why = "cancelled: the waiting client went away"
                    self.core.resolve(approval_id, "rejected", "adl-enforcerd", why)
                return self.core.approvals.get(approval_id)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        status = self._status()
        who = self._who(context)
        mine = [s for s in status.sessions if who.uid in (0, s.uid)]  # a caller sees its own sessions
        del status.sessions[:]
        status.sessions.extend(masked_sessions(mine))
        return status


class AdminService:
    """enforcer.v1.Admin"""

    def __init__(
        self,
        core: Core,
        reload: Callable[[], pb.ReloadResponse],
        terminate: Callable[[str], bool],
        status: Callable[[], pb.StatusResponse],
    ) -> None:
        self.core = core
        self._reload = reload
        self._terminate = terminate
        self._status = status

    def ListPending(self, request: pb.ListPendingRequest, context: grpc.ServicerContext) -> pb.ListPendingResponse:
        return pb.ListPendingResponse(
            pending=[approval_message(a) for a in self.core.approvals.pending(request.agent or None)]
        )

    def _decide(self, request: pb.ApprovalDecision, outcome: str) -> pb.ApprovalResult:
        if not request.approver.strip():
            raise ApiError(_STATUS.INVALID_ARGUMENT, "approver is required: the audit log records who decided")
        approval = self.core.resolve(
            request.approval_id,
            outcome,
            bounded_text(request.approver, "approver", 256),
            bounded_text(request.note, "note"),
        )
        return pb.ApprovalResult(
            decision=pb.ALLOW if outcome == "approved" else pb.DENY,
            receipt=receipt_message(approval.receipt),
        )

    def Approve(self, request: pb.ApprovalDecision, context: grpc.ServicerContext) -> pb.ApprovalResult:
        return self._decide(request, "approved")

    def Reject(self, request: pb.ApprovalDecision, context: grpc.ServicerContext) -> pb.ApprovalResult:
        return self._decide(request, "rejected")

    def ReloadPolicies(self, request: pb.ReloadRequest, context: grpc.ServicerContext) -> pb.ReloadResponse:
        return self._reload()

    def ListSessions(self, request: pb.ListSessionsRequest, context: grpc.ServicerContext) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(sessions=masked_sessions(self._status().sessions))

    def TerminateSession(
        self, request: pb.TerminateSessionRequest, context: grpc.ServicerContext
    ) -> pb.TerminateSessionResponse:
        if self.core.registry.get(request.session) is None:
            raise ApiError(_STATUS.NOT_FOUND, f"no session {request.session!r}")
        return pb.TerminateSessionResponse(terminated=self._terminate(request.session))


def handlers(service: Any, service_name: str, max_request_bytes: int) -> grpc.GenericRpcHandler:
    """Unary handlers for every method of `service_name` found on `service`, with tolerant parsing
    and ApiError -> status code."""
    descriptor = pb.DESCRIPTOR.services_by_name[service_name]
    methods = {}
    for method in descriptor.methods:
        request_type = getattr(pb, method.input_type.name)
        response_type = getattr(pb, method.output_type.name)
        methods[method.name] = grpc.unary_unary_rpc_method_handler(
            _guarded(getattr(service, method.name)),
            request_deserializer=tolerant(request_type, max_request_bytes),
            response_serializer=response_type.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(descriptor.full_name, methods)


def inline_handlers(service: EnforcerService, max_request_bytes: int) -> dict[str, PeerBatchHandler]:
    """Check and CheckBatch for the inline loop, which hands each method every request that arrived
    together: the Checks among them are decided and their records appended with one write."""
    name = pb.DESCRIPTOR.services_by_name["Enforcer"].full_name
    parse_check = parse_or_error(pb.CheckRequest, max_request_bytes)
    parse_batch = parse_or_error(pb.CheckBatchRequest, max_request_bytes)

    def check(messages: Sequence[bytes | None], peers: Sequence[bytes]) -> list[Answer]:
        return service.core.check_answers([parse_check(m) for m in messages], peers)

    def check_batch(messages: Sequence[bytes | None], peers: Sequence[bytes]) -> list[Answer]:
        answers = []
        for message, peer in zip(messages, peers, strict=True):
            try:
                response = service.check_batch(raised(parse_batch(message)), service.core.who(peer))
                answers.append((_STATUS.OK, "", response.SerializeToString()))
            except ApiError as exc:
                answers.append(error_answer(exc))
        return answers

    return {f"/{name}/Check": check, f"/{name}/CheckBatch": check_batch}


def _guarded(method: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            context.abort(_STATUS.INVALID_ARGUMENT, request.detail)
        try:
            return method(request, context)
        except ApiError as exc:
            context.abort(exc.code, str(exc))

    return call
