"""Protobuf conversion for the decision API: requests into policy actions (bounded, or an ApiError
with INVALID_ARGUMENT), decisions, receipts, approvals and sessions into messages. No state."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from ..audit import Masker, Receipt
from ..policy.model import (
    Action,
    EnvVar,
    FileAccess,
    NetworkConnect,
    ProcessExec,
    Reason,
    ToolCall,
)
from ..v1 import enforcer_pb2 as pb
from .approvals import Approval
from .arguments import ArgumentError, ArgumentLimits, parse_arguments
from .inline import Answer

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


def bounded_text(value: str, what: str, limit: int = 4096) -> str:
    if len(value) > limit:
        raise ApiError(_STATUS.INVALID_ARGUMENT, f"{what} is longer than {limit} characters")
    return value


DEFAULT_LIMITS = ArgumentLimits()


def to_action(request: pb.CheckRequest, limits: ArgumentLimits = DEFAULT_LIMITS) -> Action:
    return to_action_counted(request, limits, 0)[0]


def to_action_counted(request: pb.CheckRequest, limits: ArgumentLimits, spent: int) -> tuple[Action, int]:
    """The request's action, and `spent` plus the items of its arguments (see parse_arguments)."""
    which = request.WhichOneof("action")
    if which == "tool":
        tool = request.tool
        name = bounded_text(tool.name, "tool.name", 256)
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
            bounded_text(net.host, "network.host", 253), net.port, net.protocol or "tcp", net.address or None
        )
    if which == "file":
        mode = request.file.mode or "read"
        if mode not in ("read", "write", "read_write") or not request.file.path:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "file needs a path and mode read | write | read_write")
        return FileAccess(bounded_text(request.file.path, "file.path"), mode)  # type: ignore[arg-type]
    if which == "env":
        if not request.env.name:
            raise ApiError(_STATUS.INVALID_ARGUMENT, "env.name is empty")
        return EnvVar(bounded_text(request.env.name, "env.name", 256))
    raise ApiError(_STATUS.INVALID_ARGUMENT, "the request names no action (tool, network, file, exec or env)")


def reasons_message(reasons: tuple[Reason, ...]) -> list[pb.Reason]:
    return [pb.Reason(rule=r.rule, pointer=r.pointer, document=r.document, text=r.text) for r in reasons]


def receipt_message(receipt: Receipt | None) -> pb.AuditReceipt | None:
    if receipt is None:
        return None
    return pb.AuditReceipt(seq=receipt.seq, hash=receipt.hash, log_id=receipt.log_id)


def masked_sessions(sessions: Sequence[pb.SessionInfo]) -> list[pb.SessionInfo]:
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
        reasons=reasons_message(approval.reasons),
        created_unix_ms=approval.created_ms,
        expires_unix_ms=approval.expires_ms,
    )


def same_error(error: ApiError) -> ApiError:
    return error


def error_answer(error: ApiError) -> Answer:
    return error.code, str(error), None


def raised(result: Any) -> Any:
    if isinstance(result, ApiError):
        raise result
    return result
