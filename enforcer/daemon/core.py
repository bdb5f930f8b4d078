"""The decision core both gRPC services share: who the caller is and whether it may act as the
agent, decisions, approvals, and the audit record each answer waits for."""

from __future__ import annotations

import contextlib
import itertools
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import grpc
import orjson

from ..audit import AuditUnavailable, Entry, Receipt, records
from ..audit.events import action_facets, decision_members, refused_members
from ..audit.records import canonical
from ..audit.writer import RecordRejected
from ..policy import decide
from ..policy.model import (
    Action,
    Decision,
    ToolCall,
)
from ..policy.pii import scan_leaves
from ..v1 import enforcer_pb2 as pb
from .approvals import Approval, ApprovalError, Approvals
from .arguments import ArgumentLimits
from .auditsink import AuditSink
from .callers import ROOT, CallerTable
from .inline import Answer
from .launch import Caller, may_launch
from .messages import (
    DEFAULT_LIMITS,
    VERDICTS,
    ApiError,
    bounded_text,
    error_answer,
    raised,
    reasons_message,
    receipt_message,
    same_error,
    to_action_counted,
)
from .quota import RECORD_BASE_BYTES, UidBudget, record_bytes, record_overflows
from .registry import SessionRecord, SessionRegistry
from .store import AgentEntry, PolicyStore

log = logging.getLogger(__name__)
_STATUS = grpc.StatusCode


class _Derived(NamedTuple):
    """What follows from a decision alone: its record members and the encoded decision part of its
    CheckResponse (by dry_run, filled as needed). Built once for a decision the policy hands out
    for many calls (Policy.tool_allowed), else for each call."""

    decision: Decision  # the one it was built from: a reload brings a new one under the same key
    members: dict[str, Any]
    encoded: dict[bool, bytes]


# A request taken for at least this much has its record's payload measured as it is decided
# (_charge_payload); a smaller one's record cannot outgrow its take by more than a few KiB.
_MEASURED_FROM_BYTES = 2 * RECORD_BASE_BYTES
_DERIVED_MAX = 4096  # memo entries; reloads and removed agents leave old ones, all dropped at the bound


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
    who: Caller  # whose audit budget its record is charged to
    taken: int  # what _charge took from that budget for its request, before its record was written


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
        budget: UidBudget | None = None,
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
        # The derived parts of each agent's shared tool decisions: (agent key, tool) -> _Derived of
        # entry.policy.tool_allowed[tool]. The agent key is in the key because the encoded part names it.
        self._derived: dict[tuple[str, str], _Derived] = {}
        # Telemetry hooks (off unless configured): called with each batch of recorded decisions.
        # They run on the answering thread, so they only hand the events on; a failing one is logged.
        self.observers: list[Callable[[list[DecisionEvent]], None]] = []
        self.audit_refusals = 0  # requests answered UNAVAILABLE because the audit log refused them
        # Bytes of decision records per caller uid and window (root exempt): beyond them the uid's
        # requests are refused undecided and counted, so one caller cannot fill the shared log.
        self.budget = budget
        self.budget_refusals = 0
        # A session's approvals end with it: nobody is left to act on them.
        registry.on_end(self._end_session_approvals)

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
        entry = snapshot.resolve(bounded_text(agent, "agent", 256))
        if entry is None:
            raise ApiError(_STATUS.FAILED_PRECONDITION, f"no policy is loaded for agent {agent!r}")
        if not self.may_act(entry, who):
            raise ApiError(_STATUS.PERMISSION_DENIED, f"uid {who.uid} may not act as agent {entry.key!r}")
        return entry, ""

    # -- decisions ----------------------------------------------------------------------------

    def check(self, request: pb.CheckRequest, who: Caller = ROOT) -> pb.CheckResponse:
        return raised(self.check_many((request,), (who,))[0])

    def check_many(
        self, requests: Sequence[pb.CheckRequest | ApiError], whos: Sequence[Caller]
    ) -> list[pb.CheckResponse | ApiError]:
        """Decide every request (each for its caller), append all their records with one write, then
        answer each. A request that fails gets its ApiError in its place; one that could not be
        parsed comes as its ApiError and keeps its place."""
        return self._record_and_answer(self._decide_all(requests, whos), self._response, same_error)

    def check_answers(self, requests: Sequence[pb.CheckRequest | ApiError], peers: Sequence[bytes]) -> list[Answer]:
        """check_many for the inline loop: each answer as its status and encoded CheckResponse."""
        whos: list[Caller | ApiError] = []
        for peer in peers:
            try:
                whos.append(self.who(peer))
            except ApiError as exc:
                whos.append(exc)
        requests = [w if isinstance(w, ApiError) else r for r, w in zip(requests, whos, strict=True)]
        callers = [ROOT if isinstance(w, ApiError) else w for w in whos]
        return self._record_and_answer(self._decide_all(requests, callers), self._encoded_answer, error_answer)

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
        sizes = [self._record_bytes(who, request) for request in requests]
        taken = self._charge(who, sum(sizes), len(prepared)) if prepared else 0
        decided: list[_Decided | ApiError] = []
        for index, one in enumerate(prepared):
            try:
                # The batch was taken as a whole: each request's share, as _charge takes one alone.
                decided.append(
                    self._charge_payload(self._decide(one, sizes[index] + RECORD_BASE_BYTES if taken else 0))
                )
            except Exception as exc:
                self._withdraw(decided, "the batch it came in failed")
                error = exc if isinstance(exc, ApiError) else self._internal(exc)
                raise ApiError(error.code, f"requests[{index}]: {error}; nothing in the batch was decided") from None
        return [raised(a) for a in self._record_and_answer(decided, self._response, same_error, all_or_none=True)]

    def decide_for(
        self, entry: AgentEntry, session: str, request: pb.CheckRequest, *, dry_run: bool, who: Caller = ROOT
    ) -> pb.CheckResponse:
        """Decide for an identified caller, record the decision, and answer."""
        prepared = self._prepare_for(entry, session, request, dry_run, who=who)
        decided = [self._charge_payload(self._decide(prepared, self._charge(who, self._record_bytes(who, request))))]
        return raised(self._record_and_answer(decided, self._response, same_error)[0])

    def _decide_all(
        self, requests: Sequence[pb.CheckRequest | ApiError], whos: Sequence[Caller]
    ) -> list[_Decided | ApiError]:
        decided: list[_Decided | ApiError] = []
        for request, who in zip(requests, whos, strict=True):
            if isinstance(request, ApiError):
                decided.append(request)
                continue
            try:
                prepared = self._prepare(request, who=who)
                one = self._decide(prepared, self._charge(who, self._record_bytes(who, request)))
                decided.append(self._charge_payload(one))
            except ApiError as exc:
                decided.append(exc)
            except Exception as exc:  # fails this request alone, never the others decided with it
                decided.append(self._internal(exc))
        return decided

    def _record_bytes(self, who: Caller, request: pb.CheckRequest) -> int:
        """What _charge takes for the request: its strings as its record will hold them (escaped),
        counted only for a caller the budget bounds."""
        budget = self.budget
        if budget is None or who.uid in budget.exempt:
            return request.ByteSize()
        return record_bytes(request)

    def _charge(self, who: Caller, request_bytes: int, requests: int = 1) -> int:
        """Take the records of `requests` decisions from the caller's audit budget (what was taken),
        or refuse them with RESOURCE_EXHAUSTED, undecided: every decision still has its record."""
        budget = self.budget
        if budget is None:
            return 0
        cost = request_bytes + RECORD_BASE_BYTES * requests
        fits, counted = budget.take(who.uid, time.monotonic(), cost, requests)
        if fits:
            return cost
        self.budget_refusals += requests
        window = f"{budget.window_s:g} s"
        if counted == requests:  # the first refused in this window: the log says so at once
            with contextlib.suppress(AuditUnavailable):
                self.sink.append(
                    records.REFUSED,
                    {
                        **refused_members(
                            f"uid {who.uid} used its audit budget ({budget.capacity} bytes of decision records "
                            f"within {window}): its requests are refused undecided and counted until the window ends"
                        ),
                        "caller_uid": who.uid,
                    },
                    corr="check",
                    priority="high",
                )
        raise ApiError(
            _STATUS.RESOURCE_EXHAUSTED,
            f"uid {who.uid} has used its audit budget ({budget.capacity} bytes of decision records within "
            f"{window}, check_audit_bytes_per_uid): refused, not decided; its budget frees as its records age past "
            f"{window}",
        )

    def _charge_payload(self, decided: _Decided) -> _Decided:
        """Charge the caller's budget its record's payload beyond what _charge took, before the next
        request decided with this one is taken: those are all taken before any record is written, and
        each would find the budget unspent by the others (a batch of requests whose records are many
        times their size). Other threads deciding for the same uid see it before this record is
        written too. The payload is part of the record's line, so this never charges more than
        _charge_written would; it charges the rest. Small requests are left to _charge_written: their
        records cannot outgrow what was taken by much."""
        budget = self.budget
        if budget is None or decided.taken < _MEASURED_FROM_BYTES or decided.who.uid in budget.exempt:
            return decided
        extra = len(orjson.dumps(decided.record.payload)) - decided.taken
        if extra <= 0:
            return decided
        budget.add(decided.who.uid, time.monotonic(), extra)
        return decided._replace(taken=decided.taken + extra)

    def _charge_written(self, recorded: Sequence[_Decided], receipts: Sequence[Receipt]) -> None:
        """Charge each caller's budget what its decisions' records took in the log (their receipts
        say) beyond what _charge took for their requests: a record may repeat the request's text (in
        its reasons) and JSON escapes some characters at six bytes for one. The requests are decided;
        the uid's next ones are refused the sooner."""
        budget = self.budget
        if budget is None:
            return
        now = time.monotonic()
        for d, receipt in zip(recorded, receipts, strict=True):
            budget.add(d.who.uid, now, receipt.size - d.taken)

    def summarize(self, now: float) -> int:
        """Write the summary of each uid's requests refused over its budget in a window that has ended."""
        if self.budget is None:
            return 0
        return record_overflows(self.sink, self.budget, now, "Checks", "checks_refused", "check")

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
        action, items = to_action_counted(request, self.limits, spent)
        trace = None
        if request.HasField("trace") and request.trace.traceparent:
            trace = {"traceparent": bounded_text(request.trace.traceparent, "traceparent", 512)}
            if request.trace.tracestate:
                trace["tracestate"] = bounded_text(request.trace.tracestate, "tracestate", 512)
        request_id = bounded_text(request.request_id, "request_id", 256)
        return _Prepared(entry, session, action, trace, request_id, dry_run, items, who)

    def _decide(self, prepared: _Prepared, taken: int) -> _Decided:
        entry, session, action, trace, request_id, dry_run, _, who = prepared
        started = time.perf_counter_ns()
        # The decision and the record's masking both need the arguments' PII: searched for once.
        pii = (
            scan_leaves(action.arguments) if entry.policy.pii_mode != "none" and isinstance(action, ToolCall) else None
        )
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
        return _Decided(entry, request_id, derived, decision_id, eval_us, approval, dry_run, record, who, taken)

    def _derive(self, entry: AgentEntry, action: Action, decision: Decision) -> _Derived:
        if not (isinstance(action, ToolCall) and entry.policy.tool_allowed.get(action.name) is decision):
            return _Derived(decision, decision_members(entry.policy, decision), {})  # this call's own
        key = (entry.key, action.name)
        derived = self._derived.get(key)
        if derived is not None and derived.decision is decision:
            return derived
        if derived is None and len(self._derived) >= _DERIVED_MAX:
            self._derived.clear()
        # Kept for many records: frozen as canonical JSON, so that no record's payload can change another's.
        members = decision_members(entry.policy, decision)
        frozen = {k: orjson.Fragment(canonical(v)) if isinstance(v, list | dict) else v for k, v in members.items()}
        derived = self._derived[key] = _Derived(decision, frozen, {})
        return derived

    def _record_and_answer(
        self,
        decided: Sequence[_Decided | ApiError],
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
            recorded = [d for d in decided if isinstance(d, _Decided)]
            try:
                receipts = self.sink.append_many([d.record for d in recorded])
                break
            except RecordRejected as exc:
                rejected = ApiError(
                    _STATUS.INVALID_ARGUMENT, f"the request's audit record cannot be written ({exc}); nothing decided"
                )
                if all_or_none:
                    self._withdraw(decided, "its audit record was refused")
                    return [refuse(rejected) for _ in decided]
                position = [i for i, d in enumerate(decided) if isinstance(d, _Decided)][exc.index]
                self._withdraw([decided[position]], "its audit record was refused")
                decided = [*decided[:position], rejected, *decided[position + 1 :]]
            except AuditUnavailable as exc:
                self.audit_refusals += 1
                self._withdraw(decided, "audit failed")  # never leave an approval open for an answer nobody received
                unavailable = ApiError(
                    _STATUS.UNAVAILABLE, f"audit log unavailable; nothing is decided unrecorded: {exc}"
                )
                return [refuse(unavailable if isinstance(d, _Decided) else d) for d in decided]
        self._charge_written(recorded, receipts)
        if self.observers:
            self._observe(decided, receipts, (time.perf_counter_ns() - started) // 1000)
        if len(receipts) == len(decided):  # nothing refused: the usual case
            return [answer(cast(_Decided, d), r) for d, r in zip(decided, receipts, strict=True)]
        receipt = iter(receipts)
        return [answer(d, next(receipt)) if isinstance(d, _Decided) else refuse(d) for d in decided]

    def _observe(self, decided: Sequence[_Decided | ApiError], receipts: Sequence[Receipt], record_us: int) -> None:
        recorded = [d for d in decided if isinstance(d, _Decided)]
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
            if isinstance(d, _Decided) and d.approval is not None:
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
            reasons=reasons_message(decision.reasons),
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
        stamp.seq, stamp.hash, stamp.log_id, _ = receipt  # a Receipt is (seq, hash, log_id, size)
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

    def _end_session_approvals(self, record: SessionRecord) -> None:
        self.end_pending("the session ended", record.session)

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
            receipt=receipt_message(approval.receipt),
        )
