"""The gRPC services: Enforcer (Check, CheckBatch, Explain, WaitApproval, Status) and Admin.

Every answer is sent after its audit record is appended; a record that cannot be written makes the
call fail with UNAVAILABLE (the client library turns that into DENY). A policy denial is a
successful call. Requests are parsed by a tolerant deserializer so that a malformed or oversized
message gets INVALID_ARGUMENT from us rather than an INTERNAL error from the framework.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import grpc
import orjson

from ..audit import AuditUnavailable, Entry, Masker, Receipt, records
from ..audit.events import action_facets, decision_members
from ..audit.records import canonical
from ..audit.writer import RecordRejected
from ..explain import policy_summary
from ..policy import decide
from ..policy.model import (
    Action,
    Decision,
    EnvVar,
    FileAccess,
    NetworkConnect,
    ProcessExec,
    Reason,
    ToolCall,
)
from ..policy.pii import scan_leaves
from ..v1 import enforcer_pb2 as pb
from .approvals import Approval, ApprovalError, Approvals
from .arguments import ArgumentError, ArgumentLimits, parse_arguments
from .auditsink import AuditSink
from .callers import ROOT, CallerTable
from .inline import Answer, PeerBatchHandler
from .launch import Caller, may_launch
from .registry import SessionRegistry
from .store import AgentEntry, PolicyStore

log = logging.getLogger(__name__)

MAX_BATCH = 256
MAX_WAIT_MS = 600_000
VERDICTS = {"ALLOW": pb.ALLOW, "DENY": pb.DENY, "ASK": pb.ASK}
_STATUS = grpc.StatusCode


class ApiError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Malformed:
    """Stands in for a request that could not be parsed (see tolerant())."""

    detail: str


def parse_or_error(message_type: Any, max_bytes: int) -> Callable[[bytes | None], Any]:
    """A parser that gives the message, or an INVALID_ARGUMENT ApiError in its place (None: a unary
    call that sent no message)."""
    from_string = message_type.FromString

    def parse(data: bytes | None) -> Any:
        if data is None:
            return ApiError(_STATUS.INVALID_ARGUMENT, "a unary call needs exactly one request message")
        if len(data) > max_bytes:
            return ApiError(
                _STATUS.INVALID_ARGUMENT, f"request of {len(data)} bytes exceeds max_request_bytes ({max_bytes})"
            )
        try:
            return from_string(data)
        except Exception as exc:  # DecodeError and friends: the bytes are not this message
            return ApiError(_STATUS.INVALID_ARGUMENT, f"request is not a valid {message_type.DESCRIPTOR.name}: {exc}")

    return parse


def tolerant(message_type: Any, max_bytes: int) -> Callable[[bytes], Any]:
    """A request deserializer for grpcio: bytes that are not a request become Malformed."""
    parse = parse_or_error(message_type, max_bytes)

    def deserialize(data: bytes) -> Any:
        request = parse(data)
        return Malformed(str(request)) if type(request) is ApiError else request

    return deserialize


def _text(value: str, what: str, limit: int = 4096) -> str:
    if len(value) > limit:
        raise ApiError(_STATUS.INVALID_ARGUMENT, f"{what} is longer than {limit} characters")
    return value


DEFAULT_LIMITS = ArgumentLimits()


def to_action(request: pb.CheckRequest, limits: ArgumentLimits = DEFAULT_LIMITS) -> Action:
    return _to_action(request, limits, 0)[0]


def _to_action(request: pb.CheckRequest, limits: ArgumentLimits, spent: int) -> tuple[Action, int]:
    """The request's action, and `spent` plus the items of its arguments (see parse_arguments)."""
    which = request.WhichOneof("action")
    if which == "tool":
        tool = request.tool
        name = _text(tool.name, "tool.name", 256)
        if not name:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "tool.name is empty")
        raw = tool.arguments_json
        try:
            arguments, spent = parse_arguments(raw, limits, spent) if raw else ({}, spent)
        except ArgumentError as exc:
            raise ApiError(_STATUS.INVALID_ARGUMENT, str(exc)) from None
        return ToolCall(name, arguments), spent
    if which == "exec":
        argv = request.exec.argv
        if not argv:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "exec.argv is empty")
        spent += len(argv)
        if spent > limits.max_items or any(len(a) > limits.max_string for a in argv):
            raise ApiError(
                _STATUS.INVALID_ARGUMENT,
                f"exec.argv: more than max_argument_items ({limits.max_items}) arguments or one longer than "
                f"max_argument_string ({limits.max_string})",
            )
        return ProcessExec(tuple(argv), request.exec.resolved_path or None), spent
    return _other_action(request, which), spent


def _other_action(request: pb.CheckRequest, which: str | None) -> Action:
    if which == "network":
        net = request.network
        if not net.host or not 0 < net.port < 65536:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "network needs a host and a port in 1..65535")
        return NetworkConnect(
            _text(net.host, "network.host", 253), net.port, net.protocol or "tcp", net.address or None
        )
    if which == "file":
        mode = request.file.mode or "read"
        if mode not in ("read", "write", "read_write") or not request.file.path:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "file needs a path and mode read | write | read_write")
        return FileAccess(_text(request.file.path, "file.path"), mode)  # type: ignore[arg-type]
    if which == "env":
        if not request.env.name:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "env.name is empty")
        return EnvVar(_text(request.env.name, "env.name", 256))
    raise ApiError(_STATUS.INVALID_ARGUMENT, "the request names no action (tool, network, file, exec or env)")


def _reasons(reasons: tuple[Reason, ...]) -> list[pb.Reason]:
    return [pb.Reason(rule=r.rule, pointer=r.pointer, document=r.document, text=r.text) for r in reasons]


def _receipt(receipt: Receipt | None) -> pb.AuditReceipt | None:
    if receipt is None:
        return None
    return pb.AuditReceipt(seq=receipt.seq, hash=receipt.hash, log_id=receipt.log_id)


class _Derived(NamedTuple):
    """What follows from a decision alone: its record members and the encoded decision part of its
    CheckResponse (by dry_run, filled as needed). Built once for a decision the policy hands out
    for many calls (Policy.tool_allowed), else for each call."""

    decision: Decision  # held while memoized, so that its id() stays its own
    members: dict[str, Any]
    encoded: dict[bool, bytes]


class _Prepared(NamedTuple):
    """A request that passed every check that needs no decision: who asks, and for what."""

    entry: AgentEntry
    session: str
    action: Action
    trace: dict[str, str] | None
    request_id: str
    dry_run: bool
    items: int  # in the arguments, and those of the requests before it in a batch
    who: Caller  # the caller, as the kernel named it


class DecisionEvent(NamedTuple):
    """One decision as telemetry sees it, once its audit record is written (see Core.observers)."""

    agent: str
    decision: str  # ALLOW | DENY | ASK
    rules: tuple[str, ...]
    decision_id: str
    session: str
    dry_run: bool
    eval_us: int  # deciding
    record_us: int  # appending the records written with it
    trace: dict[str, str] | None
    audit_seq: int


class _Decided(NamedTuple):
    """A decision waiting for its audit record."""

    entry: AgentEntry
    request_id: str
    derived: _Derived
    decision_id: str
    eval_us: int
    approval: Approval | None
    dry_run: bool
    record: Entry


def _raised(result: Any) -> Any:
    if isinstance(result, ApiError):
        raise result
    return result


class Core:
    """Identity, decisions, approvals and their audit records: everything both services share."""

    def __init__(
        self,
        store: PolicyStore,
        sink: AuditSink,
        registry: SessionRegistry,
        approvals: Approvals,
        clock_ms: Callable[[], int],
        limits: ArgumentLimits = DEFAULT_LIMITS,
        callers: CallerTable | None = None,
        agent_callers: dict[str, list[str]] | None = None,
    ) -> None:
        self.store, self.sink, self.registry, self.approvals = store, sink, registry, approvals
        self.clock_ms = clock_ms
        self.limits = limits
        self.callers = callers or CallerTable()
        self.agent_callers = agent_callers or {}
        self._allowed: dict[tuple[int, Caller, str], bool] = {}  # (generation, caller, agent) -> may act
        # Decision ids: a random per-instance prefix and a counter. Unique across restarts without
        # a getrandom() call on every Check's path.
        self._id_prefix = "dec-" + secrets.token_hex(6) + "-"
        self._id_counter = itertools.count(1)
        self._derived: dict[int, _Derived] = {}  # by id() of a shared decision
        # Telemetry hooks (off unless configured): called with each batch of recorded decisions.
        # They run on the answering thread, so they only hand the events on; a failing one is logged.
        self.observers: list[Callable[[list[DecisionEvent]], None]] = []
        self.audit_refusals = 0  # requests answered UNAVAILABLE because the audit log refused them
        # A session's approvals end with it: nobody is left to act on them.
        registry.on_end(lambda record: self.end_pending("the session ended", record.session))

    # -- identity -----------------------------------------------------------------------------

    def who(self, peer: bytes | str) -> Caller:
        """The caller of a call on the API socket, as the kernel named it (see callers.py)."""
        caller = self.callers.of(peer)
        if caller is None:
            raise ApiError(_STATUS.PERMISSION_DENIED, "the caller cannot be identified (or its connection closed)")
        return caller

    def may_act(self, entry: AgentEntry, who: Caller) -> bool:
        """Whether `who` may Check as the agent without a session: agent_callers, as for launches."""
        if who.uid == 0:
            return True
        key = (self.store.snapshot.generation, who, entry.key)
        allowed = self._allowed.get(key)
        if allowed is None:
            if len(self._allowed) >= 4096:
                self._allowed.clear()
            allowed = self._allowed[key] = may_launch(self.agent_callers, entry, who)
        return allowed

    def caller(self, agent: str, session: str, token: str, who: Caller = ROOT) -> tuple[AgentEntry, str]:
        """The policy entry a request speaks for, and its session ('' for none)."""
        snapshot = self.store.snapshot
        if not session and len(agent) <= 256:  # the usual caller: a loaded agent, by key, id or name
            entry = snapshot.resolve(agent)
            if entry is not None:
                if not self.may_act(entry, who):
                    raise ApiError(_STATUS.PERMISSION_DENIED, f"uid {who.uid} may not act as agent {entry.key!r}")
                return entry, ""
        if not snapshot.agents:
            raise ApiError(_STATUS.FAILED_PRECONDITION, "no policy is loaded")
        if session:
            record = self.registry.authenticate(session, token)
            if record is None or who.uid not in (0, record.uid):  # a token works only for its session's uid
                raise ApiError(_STATUS.UNAUTHENTICATED, f"unknown session {session!r} or wrong session token")
            entry = snapshot.resolve(record.agent)
            if entry is None:
                raise ApiError(_STATUS.FAILED_PRECONDITION, f"the policy of agent {record.agent!r} is no longer loaded")
            if agent and snapshot.resolve(agent) is not entry:
                raise ApiError(_STATUS.PERMISSION_DENIED, f"session {session} belongs to agent {record.agent!r}")
            return entry, session
        if not agent:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "name the agent (or a session with its token)")
        entry = snapshot.resolve(_text(agent, "agent", 256))
        if entry is None:
            raise ApiError(_STATUS.FAILED_PRECONDITION, f"no policy is loaded for agent {agent!r}")
        if not self.may_act(entry, who):
            raise ApiError(_STATUS.PERMISSION_DENIED, f"uid {who.uid} may not act as agent {entry.key!r}")
        return entry, ""

    # -- decisions ----------------------------------------------------------------------------

    def check(self, request: pb.CheckRequest, who: Caller = ROOT) -> pb.CheckResponse:
        return _raised(self.check_many((request,), (who,))[0])

    def check_many(
        self, requests: Sequence[pb.CheckRequest | ApiError], whos: Sequence[Caller]
    ) -> list[pb.CheckResponse | ApiError]:
        """Decide every request (each for its caller), append all their records with one write, then
        answer each. A request that fails gets its ApiError in its place; one that could not be
        parsed comes as its ApiError and keeps its place."""
        return self._record_and_answer(self._decide_all(requests, whos), self._response, _same)

    def check_answers(self, requests: Sequence[pb.CheckRequest | ApiError], peers: Sequence[bytes]) -> list[Answer]:
        """check_many for the inline loop: each answer as its status and encoded CheckResponse."""
        whos: list[Caller | ApiError] = []
        for peer in peers:
            try:
                whos.append(self.who(peer))
            except ApiError as exc:
                whos.append(exc)
        requests = [w if type(w) is ApiError else r for r, w in zip(requests, whos, strict=True)]
        callers = [ROOT if type(w) is ApiError else w for w in whos]
        return self._record_and_answer(self._decide_all(requests, callers), self._encoded_answer, _error_answer)

    def check_batch(self, requests: Sequence[pb.CheckRequest], who: Caller = ROOT) -> list[pb.CheckResponse]:
        """Every request of a batch is checked before any is decided, and the batch is answered
        as a whole: if one request fails, nothing in it is decided, recorded or left waiting for
        an approval."""
        prepared = []
        spent = 0
        for index, request in enumerate(requests):
            try:
                one = self._prepare(request, spent, who)
                spent = one.items
                prepared.append(one)
            except ApiError as exc:
                raise ApiError(exc.code, f"requests[{index}]: {exc}; nothing in the batch was decided") from None
        decided: list[_Decided | ApiError] = []
        for index, one in enumerate(prepared):
            try:
                decided.append(self._decide(one))
            except Exception as exc:
                self._withdraw(decided, "the batch it came in failed")
                error = exc if isinstance(exc, ApiError) else self._internal(exc)
                raise ApiError(error.code, f"requests[{index}]: {error}; nothing in the batch was decided") from None
        return [_raised(a) for a in self._record_and_answer(decided, self._response, _same, all_or_none=True)]

    def decide_for(
        self, entry: AgentEntry, session: str, request: pb.CheckRequest, *, dry_run: bool, who: Caller = ROOT
    ) -> pb.CheckResponse:
        """Decide for an identified caller, record the decision, and answer."""
        decided = [self._decide(self._prepare_for(entry, session, request, dry_run, who=who))]
        return _raised(self._record_and_answer(decided, self._response, _same)[0])

    def _decide_all(
        self, requests: Sequence[pb.CheckRequest | ApiError], whos: Sequence[Caller]
    ) -> list[_Decided | ApiError]:
        decided: list[_Decided | ApiError] = []
        for request, who in zip(requests, whos, strict=True):
            if type(request) is ApiError:
                decided.append(request)
                continue
            try:
                decided.append(self._decide(self._prepare(request, who=who)))
            except ApiError as exc:
                decided.append(exc)
            except Exception as exc:  # fails this request alone, never the others decided with it
                decided.append(self._internal(exc))
        return decided

    @staticmethod
    def _internal(exc: Exception) -> ApiError:
        log.error("a request could not be decided", exc_info=exc)
        return ApiError(_STATUS.INTERNAL, f"this request could not be decided ({type(exc).__name__})")

    def _prepare(self, request: pb.CheckRequest, spent: int = 0, who: Caller = ROOT) -> _Prepared:
        entry, session = self.caller(request.agent, request.session, request.session_token, who)
        return self._prepare_for(entry, session, request, request.mode == pb.DRY_RUN, spent, who)

    def _prepare_for(
        self,
        entry: AgentEntry,
        session: str,
        request: pb.CheckRequest,
        dry_run: bool,
        spent: int = 0,
        who: Caller = ROOT,
    ) -> _Prepared:
        action, items = _to_action(request, self.limits, spent)
        trace = None
        if request.HasField("trace") and request.trace.traceparent:
            trace = {"traceparent": _text(request.trace.traceparent, "traceparent", 512)}
            if request.trace.tracestate:
                trace["tracestate"] = _text(request.trace.tracestate, "tracestate", 512)
        request_id = _text(request.request_id, "request_id", 256)
        return _Prepared(entry, session, action, trace, request_id, dry_run, items, who)

    def _decide(self, prepared: _Prepared) -> _Decided:
        entry, session, action, trace, request_id, dry_run, _, who = prepared
        started = time.perf_counter_ns()
        # The decision and the record's masking both need the arguments' PII: searched for once.
        pii = scan_leaves(action.arguments) if entry.policy.pii_mode != "none" and type(action) is ToolCall else None
        decision = decide(entry.policy, action, pii=pii)
        eval_us = (time.perf_counter_ns() - started) // 1000
        decision_id = f"{self._id_prefix}{next(self._id_counter)}"
        derived = self._derive(entry, action, decision)
        payload = {
            **derived.members,
            **action_facets(action, entry.masker, pii),
            "decision_id": decision_id,
            "eval_us": eval_us,
            "caller_uid": who.uid,
        }
        if request_id:
            payload["request_id"] = request_id
        if session:
            payload["session"] = session
        if dry_run:
            payload["mode"] = "dry_run"
        approval = None
        if decision.verdict == "ASK" and not dry_run:  # opened last: nothing after it can refuse the request
            approval = self._open_approval(entry, session, decision_id, action, payload, decision)
            payload["approval_id"] = approval.approval_id
            payload["approval_expires_ms"] = approval.expires_ms
        record = Entry(
            records.DECISION,
            payload,
            session or decision_id,
            trace,
            "normal" if decision.verdict == "ALLOW" else "high",
        )
        return _Decided(entry, request_id, derived, decision_id, eval_us, approval, dry_run, record)

    def _derive(self, entry: AgentEntry, action: Action, decision: Decision) -> _Derived:
        derived = self._derived.get(id(decision))
        if derived is not None and derived.decision is decision:
            return derived
        members = decision_members(entry.policy, decision)
        if not (isinstance(action, ToolCall) and entry.policy.tool_allowed.get(action.name) is decision):
            return _Derived(decision, members, {})
        if len(self._derived) >= 4096:  # reloads bring new policies; old entries go
            self._derived.clear()
        # Kept for many records: frozen as canonical JSON, so that no record's payload can change another's.
        frozen = {k: orjson.Fragment(canonical(v)) if isinstance(v, list | dict) else v for k, v in members.items()}
        derived = self._derived[id(decision)] = _Derived(decision, frozen, {})
        return derived

    def _record_and_answer(
        self,
        decided: list[_Decided | ApiError],
        answer: Callable[[_Decided, Receipt], Any],
        refuse: Callable[[ApiError], Any],
        *,
        all_or_none: bool = False,
    ) -> list[Any]:
        """Append the decisions' records, then answer each decision with `answer` and each error with
        `refuse`, in order. A record the log refuses (it cannot be encoded) fails its own request and
        the others are appended without it; with `all_or_none` it fails every request."""
        started = time.perf_counter_ns() if self.observers else 0
        while True:
            try:
                receipts = self.sink.append_many([d.record for d in decided if type(d) is _Decided])
                break
            except RecordRejected as exc:
                rejected = ApiError(
                    _STATUS.INVALID_ARGUMENT, f"the request's audit record cannot be written ({exc}); nothing decided"
                )
                if all_or_none:
                    self._withdraw(decided, "its audit record was refused")
                    return [refuse(rejected) for _ in decided]
                position = [i for i, d in enumerate(decided) if type(d) is _Decided][exc.index]
                self._withdraw([decided[position]], "its audit record was refused")
                decided = [*decided[:position], rejected, *decided[position + 1 :]]
            except AuditUnavailable as exc:
                self.audit_refusals += 1
                self._withdraw(decided, "audit failed")  # never leave an approval open for an answer nobody received
                unavailable = ApiError(
                    _STATUS.UNAVAILABLE, f"audit log unavailable; nothing is decided unrecorded: {exc}"
                )
                return [refuse(unavailable if type(d) is _Decided else d) for d in decided]
        if self.observers:
            self._observe(decided, receipts, (time.perf_counter_ns() - started) // 1000)
        if len(receipts) == len(decided):  # nothing refused: the usual case
            return list(map(answer, decided, receipts))
        receipt = iter(receipts)
        return [answer(d, next(receipt)) if type(d) is _Decided else refuse(d) for d in decided]

    def _observe(self, decided: Sequence[_Decided | ApiError], receipts: Sequence[Receipt], record_us: int) -> None:
        recorded = [d for d in decided if type(d) is _Decided]
        events = [
            DecisionEvent(
                d.entry.key,
                d.derived.decision.verdict,
                tuple(r.rule for r in d.derived.decision.reasons),
                d.decision_id,
                d.record.payload.get("session", ""),
                d.dry_run,
                d.eval_us,
                record_us,
                d.record.trace,
                receipt.seq,
            )
            for d, receipt in zip(recorded, receipts, strict=True)
        ]
        for observer in self.observers:
            try:
                observer(events)
            except Exception:
                log.exception("a telemetry observer failed; the decisions stand")

    def _withdraw(self, decided: Sequence[_Decided | ApiError], why: str) -> None:
        """Close the approvals of decisions whose answers are never sent."""
        for d in decided:
            if type(d) is _Decided and d.approval is not None:
                self.approvals.resolve(d.approval.approval_id, "rejected", "adl-enforcerd", why, lambda a: None)

    def _response(self, decided: _Decided, receipt: Receipt) -> pb.CheckResponse:
        response = self._decision_part(decided)
        response.MergeFrom(self._call_part(decided, receipt))
        return response

    def _encoded_answer(self, decided: _Decided, receipt: Receipt) -> Answer:
        """_response encoded, as an OK answer. The members that follow from the decision alone are
        encoded once for a shared decision (see _Derived) and the call's own members appended:
        protobuf reads the two as one message."""
        encoded = decided.derived.encoded
        part = encoded.get(decided.dry_run)
        if part is None:
            part = encoded[decided.dry_run] = self._decision_part(decided).SerializeToString()
        return _STATUS.OK, "", part + self._call_part(decided, receipt).SerializeToString()

    def _decision_part(self, decided: _Decided) -> pb.CheckResponse:
        decision = decided.derived.decision
        return pb.CheckResponse(
            decision=VERDICTS[decision.verdict],
            reasons=_reasons(decision.reasons),
            obligations_json=orjson.dumps(dict(decision.obligations)).decode() if decision.obligations else "",
            policy_digest=decision.policy_digest,
            agent=decided.entry.key,
            mode=pb.DRY_RUN if decided.dry_run else pb.ENFORCE,
        )

    def _call_part(self, decided: _Decided, receipt: Receipt) -> pb.CheckResponse:
        # Members set one by one: with keyword arguments this took about twice as long.
        response = pb.CheckResponse()
        response.request_id = decided.request_id
        response.decision_id = decided.decision_id
        response.eval_us = decided.eval_us
        stamp = response.receipt
        stamp.seq, stamp.hash, stamp.log_id = receipt  # a Receipt is (seq, hash, log_id)
        if decided.approval is not None:
            response.approval_id = decided.approval.approval_id
            response.approval_expires_unix_ms = decided.approval.expires_ms
        return response

    def _open_approval(
        self,
        entry: AgentEntry,
        session: str,
        decision_id: str,
        action: Action,
        payload: dict[str, Any],
        decision: Decision,
    ) -> Approval:
        timeout_s = int(decision.obligations.get("approval_timeout_s") or 300)
        try:
            return self.approvals.open(
                decision_id=decision_id,
                agent=entry.key,
                session=session,
                tool=action.name if isinstance(action, ToolCall) else "",
                arguments=payload.get("args"),
                reasons=decision.reasons,
                expires_ms=self.clock_ms() + timeout_s * 1000,
                uid=payload.get("caller_uid"),
            )
        except ApprovalError as exc:
            raise ApiError(_STATUS.RESOURCE_EXHAUSTED, str(exc)) from None

    # -- approvals ----------------------------------------------------------------------------

    def resolve(self, approval_id: str, outcome: str, approver: str, note: str) -> Approval:
        def record(approval: Approval) -> Receipt:
            return self.sink.append(
                records.APPROVAL,
                {
                    "agent": approval.agent,
                    "decision": "allow" if outcome == "approved" else "deny",
                    "outcome": outcome,
                    "approval_id": approval.approval_id,
                    "decision_id": approval.decision_id,
                    "tool": approval.tool,
                    "approver": approver,
                    "note": note,
                    "rules": [f"hitl.{outcome}"],
                },
                corr=approval.session or approval.decision_id,
                priority="high",
                sync=True,
            )

        try:
            return self.approvals.resolve(approval_id, outcome, approver, note, record)  # type: ignore[arg-type]
        except ApprovalError as exc:
            code = _STATUS.NOT_FOUND if exc.code == "not_found" else _STATUS.FAILED_PRECONDITION
            raise ApiError(code, str(exc)) from None
        except AuditUnavailable as exc:
            raise ApiError(_STATUS.UNAVAILABLE, f"audit log unavailable: {exc}") from None

    def end_pending(self, note: str, session: str | None = None) -> int:
        """Reject every pending approval (of `session`, or all), each with its record: their waiters
        are told DENY at once. How many were ended."""
        ended = 0
        for approval in self.approvals.of_session(session) if session else self.approvals.pending():
            try:
                self.resolve(approval.approval_id, "rejected", "adl-enforcerd", note)
                ended += 1
            except ApiError:
                continue  # resolved meanwhile; or the log is down and the expiry tick retries
        return ended

    def expire_due(self) -> None:
        for approval in self.approvals.due():
            try:
                self.resolve(approval.approval_id, "expired", "", "no decision before the approval timeout")
            except ApiError as exc:
                if exc.code == _STATUS.UNAVAILABLE:
                    return  # the audit log is down or stalled: all of them are retried on the next tick
                continue  # resolved meanwhile

    def approval_response(self, approval: Approval) -> pb.CheckResponse:
        if approval.outcome == "approved":
            verdict, rule, text = pb.ALLOW, "hitl.approved", f"approved by {approval.approver}"
        elif approval.outcome == "pending":
            verdict, rule, text = pb.ASK, "hitl.pending", "waiting for a human decision"
        else:
            verdict = pb.DENY
            rule = f"hitl.{approval.outcome}"
            text = f"rejected by {approval.approver}" if approval.outcome == "rejected" else "approval timed out"
        if approval.note:
            text += f": {approval.note}"
        return pb.CheckResponse(
            decision=verdict,
            reasons=[pb.Reason(rule=rule, document="enforcer", text=text)],
            decision_id=approval.decision_id,
            approval_id=approval.approval_id,
            approval_expires_unix_ms=approval.expires_ms,
            agent=approval.agent,
            receipt=_receipt(approval.receipt),
        )


def _masked(sessions: Sequence[pb.SessionInfo]) -> list[pb.SessionInfo]:
    """Sessions with their argv masked as tool arguments are in the audit log."""
    shown = []
    for session in sessions:
        copy = pb.SessionInfo()
        copy.CopyFrom(session)
        copy.argv[:] = [str(a) for a in Masker().mask(list(session.argv)).value]
        shown.append(copy)
    return shown


def approval_message(approval: Approval) -> pb.Approval:
    return pb.Approval(
        approval_id=approval.approval_id,
        decision_id=approval.decision_id,
        agent=approval.agent,
        session=approval.session,
        tool=approval.tool,
        arguments_json=orjson.dumps(approval.arguments).decode(),
        reasons=_reasons(approval.reasons),
        created_unix_ms=approval.created_ms,
        expires_unix_ms=approval.expires_ms,
    )


class EnforcerService:
    """enforcer.v1.Enforcer"""

    def __init__(
        self, core: Core, status: Callable[[], pb.StatusResponse], max_waits: int = 256, *, admin: bool = False
    ) -> None:
        self.core = core
        self._status = status
        self.admin = admin  # on the admin socket (root only): every caller is root
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
        return pb.ExplainResponse(decision=decision, policy_json=orjson.dumps(policy_summary(entry.policy)).decode())

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
        status.sessions.extend(_masked(mine))
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
            request.approval_id, outcome, _text(request.approver, "approver", 256), _text(request.note, "note")
        )
        return pb.ApprovalResult(
            decision=pb.ALLOW if outcome == "approved" else pb.DENY,
            receipt=_receipt(approval.receipt),
        )

    def Approve(self, request: pb.ApprovalDecision, context: grpc.ServicerContext) -> pb.ApprovalResult:
        return self._decide(request, "approved")

    def Reject(self, request: pb.ApprovalDecision, context: grpc.ServicerContext) -> pb.ApprovalResult:
        return self._decide(request, "rejected")

    def ReloadPolicies(self, request: pb.ReloadRequest, context: grpc.ServicerContext) -> pb.ReloadResponse:
        return self._reload()

    def ListSessions(self, request: pb.ListSessionsRequest, context: grpc.ServicerContext) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(sessions=_masked(self._status().sessions))

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
                response = service.check_batch(_raised(parse_batch(message)), service.core.who(peer))
                answers.append((_STATUS.OK, "", response.SerializeToString()))
            except ApiError as exc:
                answers.append(_error_answer(exc))
        return answers

    return {f"/{name}/Check": check, f"/{name}/CheckBatch": check_batch}


def _same(error: ApiError) -> ApiError:
    return error


def _error_answer(error: ApiError) -> Answer:
    return error.code, str(error), None


def _guarded(method: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
    def call(request: Any, context: grpc.ServicerContext) -> Any:
        if isinstance(request, Malformed):
            context.abort(_STATUS.INVALID_ARGUMENT, request.detail)
        try:
            return method(request, context)
        except ApiError as exc:
            context.abort(exc.code, str(exc))

    return call
