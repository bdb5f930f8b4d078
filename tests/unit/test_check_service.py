"""The Check path in process: what is built once per shared decision (record members, the encoded
decision part of the response) gives the same records and answers as building it for each call."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcer.audit import Receipt, WriterSettings, records
from enforcer.audit.events import decision_payload
from enforcer.audit.verify import verify_directory
from enforcer.daemon import core as core_module
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.arguments import ArgumentError, ArgumentLimits, parse_arguments
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.callers import ROOT
from enforcer.daemon.core import Core
from enforcer.daemon.messages import ApiError, to_action
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.service import EnforcerService, inline_handlers
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions, decide
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.budgets import examples

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
CHECK = "/enforcer.v1.Enforcer/Check"


def _as_root(check: Any) -> Any:
    """An inline Check handler called as root over the internal socket (peer "unix:")."""
    return lambda messages: check(messages, [b"unix:"] * len(messages))


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@contextlib.contextmanager
def _running_core(directory: Path, schemas: Any) -> Iterator[Core]:
    policies = directory / "policies"
    policies.mkdir()
    for name in ("coding-agent.adl.json", "invoice-processor.adl.json", "invoice-processor.aaif.json"):
        shutil.copy(EXAMPLES / name, policies)
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    sink = AuditSink(directory / "audit", directory / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        yield Core(store, sink, SessionRegistry(), Approvals(_now_ms, 10), _now_ms)
    finally:
        sink.close()


@pytest.fixture
def core(tmp_path: Path, schemas: Any) -> Iterator[Core]:
    with _running_core(tmp_path, schemas) as running:
        yield running


@pytest.fixture(scope="module")
def core_for_many(tmp_path_factory: pytest.TempPathFactory, schemas: Any) -> Iterator[Core]:
    with _running_core(tmp_path_factory.mktemp("check"), schemas) as running:
        yield running


def _tool(agent: str, name: str, arguments: dict[str, Any], **extra: Any) -> pb.CheckRequest:
    return pb.CheckRequest(agent=agent, tool=pb.ToolCall(name=name, arguments_json=orjson.dumps(arguments)), **extra)


REQUESTS = [
    _tool("Coding Agent", "read_file", {"path": "src/app.py"}, request_id="r1"),  # plain ALLOW (shared)
    _tool("Coding Agent", "read_file", {"path": "docs/ops@acme.example.md"}),  # shared, masked arguments
    _tool("Coding Agent", "read_file", {"path": "src/app.py"}, mode=pb.DRY_RUN),  # shared, dry run
    _tool("Coding Agent", "format_disk", {}),  # DENY
    _tool("Invoice Processor", "notify_vendor", {"invoice_id": "INV-1", "message": "call +44 20 7946 0958"}),  # PII
    _tool("Invoice Processor", "approve_payment", {"invoice_id": "INV-1", "amount": 5}),  # ASK
]


def _decision_records(core: Core) -> list[dict[str, Any]]:
    lines = b"".join(p.read_bytes() for p in sorted(core.sink.directory.glob("*.jsonl"))).splitlines()
    found = []
    for line in lines:
        record = orjson.loads(line)
        unhashed = {k: v for k, v in record.items() if k != "hash"}
        assert records.with_hash(records.canonical(unhashed), record["hash"]) == line + b"\n"  # canonical as stored
        found.append(record)
    return [r for r in found if records.kind_of(r) == records.DECISION]


def _per_call(payload: dict[str, Any]) -> dict[str, Any]:
    assert payload["caller_uid"] == 0  # these tests call as root
    keys = ("decision_id", "eval_us", "caller_uid", "request_id", "mode", "approval_id", "approval_expires_ms")
    return {k: payload[k] for k in keys if k in payload}


@pytest.mark.parametrize("serialized", [True, False])
def test_records_and_answers_match_those_built_for_each_call(core: Core, serialized: bool) -> None:
    if serialized:
        check = _as_root(inline_handlers(EnforcerService(core, pb.StatusResponse), 1 << 20)[CHECK])
        answers = [pb.CheckResponse.FromString(body) for _, _, body in check([r.SerializeToString() for r in REQUESTS])]
    else:
        answers = [core.check(r) for r in REQUESTS]
    again = core.check_many(REQUESTS, [ROOT] * len(REQUESTS))  # the shared decisions' parts now come from the memo
    assert [a.decision for a in answers] == [pb.ALLOW, pb.ALLOW, pb.ALLOW, pb.DENY, pb.ALLOW, pb.ASK]
    written = _decision_records(core)
    assert len(written) == 2 * len(REQUESTS)
    for request, answer, record in zip(REQUESTS * 2, answers + again, written, strict=True):
        _assert_built_as_for_each_call(core, request, answer, record)
    assert "[masked:email]" in written[1]["payload"]["args"]["path"]
    assert written[4]["payload"]["obligations"]["pii"]["kinds"] == ["phone"]
    assert written[5]["payload"]["approval_id"] == answers[5].approval_id
    assert verify_directory(core.sink.directory).intact


def _assert_built_as_for_each_call(core: Core, request: pb.CheckRequest, answer: Any, record: dict[str, Any]) -> None:
    """The record and the answer equal what the per-call builders make of the same decision."""
    entry = core.store.snapshot.resolve(request.agent)
    assert entry is not None
    action = to_action(request)
    payload = record["payload"]
    expected = decision_payload(entry.policy, action, decide(entry.policy, action), entry.masker)
    assert payload == {**expected, **_per_call(payload)}
    prepared = core._prepare_for(entry, "", request, request.mode == pb.DRY_RUN)
    built = core._response(core._decide(prepared, 0), _receipt(record))
    for member in ("decision", "reasons", "obligations_json", "policy_digest", "agent", "mode"):
        assert getattr(answer, member) == getattr(built, member), member
    assert (answer.decision_id, answer.request_id) == (payload["decision_id"], request.request_id)
    assert (answer.receipt.seq, answer.receipt.hash) == (record["seq"], record["hash"])


def _receipt(record: dict[str, Any]) -> Receipt:
    return Receipt(record["seq"], record["hash"], record["id"].rsplit(".", 1)[0])


def test_an_unparsable_request_keeps_its_place_among_the_answers(core: Core) -> None:
    check = _as_root(inline_handlers(EnforcerService(core, pb.StatusResponse), 1 << 20)[CHECK])
    good = REQUESTS[0].SerializeToString()
    answers = check([good, b"\xff\xff", None, good])
    assert [code for code, _, _ in answers] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OK,
    ]
    assert len(_decision_records(core)) == 2


_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["src/app.py", "ops@acme.example", "+44 20 7946 0958", "4111 1111 1111 1111", "sk-" + "a" * 24]),
)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)


# The invoice agent's AAIF document asks for PII handling: the daemon searches its arguments for PII
# once, for the decision and the record's masking, where decision_payload() searches twice.
_AGENT_TOOL = st.sampled_from(
    [("Coding Agent", name) for name in ("read_file", "write_file", "run_tests", "delete_path", "format_disk")]
    + [("Invoice Processor", name) for name in ("notify_vendor", "search_invoices")]
)
_MEMBER = st.sampled_from(["path", "content", "pattern", "invoice_id", "message", "vendor"])


@settings(max_examples=examples(200), deadline=None)
@given(
    agent_tool=_AGENT_TOOL,
    arguments=st.dictionaries(_MEMBER | _TEXT, _JSON, max_size=3),
    dry_run=st.booleans(),
    request_id=st.sampled_from(["", "r-7"]),
)
def test_any_tool_call_is_recorded_and_answered_as_built_for_each_call(
    core_for_many: Core, agent_tool: tuple[str, str], arguments: dict[str, Any], dry_run: bool, request_id: str
) -> None:
    agent, name = agent_tool
    request = _tool(agent, name, arguments, request_id=request_id, mode=pb.DRY_RUN if dry_run else pb.ENFORCE)
    check = _as_root(inline_handlers(EnforcerService(core_for_many, pb.StatusResponse), 1 << 20)[CHECK])
    ((code, _, body),) = check([request.SerializeToString()])
    assert code == grpc.StatusCode.OK
    answers = [pb.CheckResponse.FromString(body), core_for_many.check(request)]
    for answer, record in zip(answers, _decision_records(core_for_many)[-2:], strict=True):
        _assert_built_as_for_each_call(core_for_many, request, answer, record)


def test_a_request_that_cannot_be_recorded_or_decided_fails_alone(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    check = _as_root(inline_handlers(EnforcerService(core, pb.StatusResponse), 1 << 20)[CHECK])
    good = REQUESTS[0].SerializeToString()
    # Limits raised past what the record's encoder takes: the log refuses that one record only.
    core.limits = ArgumentLimits(max_depth=1000)
    nested = '{"path": "a", "x": ' + "[" * 253 + "]" * 253 + "}"  # the record adds the levels too many
    deep = pb.CheckRequest(agent="Coding Agent", tool=pb.ToolCall(name="read_file", arguments_json=nested))
    answers = check([good, deep.SerializeToString(), good])
    assert [code for code, _, _ in answers] == [
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.OK,
    ]
    assert "audit record cannot be written" in answers[1][1]
    assert core.sink.healthy and len(_decision_records(core)) == 2

    real_decide = core_module.decide

    def failing(policy: Any, action: Any, **kw: Any) -> Any:
        if getattr(action, "name", "") == "run_tests":
            raise RecursionError("deep inside")
        return real_decide(policy, action, **kw)

    monkeypatch.setattr(core_module, "decide", failing)
    broken = _tool("Coding Agent", "run_tests", {}).SerializeToString()
    answers = check([good, broken, good])
    assert [code for code, _, _ in answers] == [grpc.StatusCode.OK, grpc.StatusCode.INTERNAL, grpc.StatusCode.OK]
    assert "RecursionError" in answers[1][1] and len(_decision_records(core)) == 4
    assert verify_directory(core.sink.directory).intact


def test_a_batch_with_a_bad_request_decides_nothing_and_leaves_no_approval(core: Core) -> None:
    ask = REQUESTS[5]  # opens an approval
    service = EnforcerService(core, pb.StatusResponse)
    bad = pb.CheckRequest(agent="Coding Agent", tool=pb.ToolCall(name="read_file", arguments_json='{"a": 1, "a": 2}'))
    with pytest.raises(ApiError) as refused:
        service.check_batch(pb.CheckBatchRequest(requests=[ask, REQUESTS[0], bad]), ROOT)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT and str(refused.value).startswith("requests[2]: ")
    assert core.approvals.pending() == [] and _decision_records(core) == []
    # one that fails while deciding (the approval limit) withdraws the approvals opened before it
    core.approvals = Approvals(_now_ms, 1)
    with pytest.raises(ApiError) as full:
        service.check_batch(pb.CheckBatchRequest(requests=[ask, ask]), ROOT)
    assert full.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and str(full.value).startswith("requests[1]: ")
    assert core.approvals.pending() == [] and _decision_records(core) == []


_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=examples(300), deadline=None)
@given(value=st.dictionaries(st.text(max_size=4), _VALUE, min_size=1, max_size=4), spaces=st.booleans())
def test_arguments_parse_as_json_and_any_repeated_name_is_refused(value: dict[str, Any], spaces: bool) -> None:
    text = json.dumps(value, separators=(", ", " : ") if spaces else (",", ":"))
    assert parse_arguments(text, ArgumentLimits())[0] == value
    first = next(iter(value))
    repeated = text[:-1] + ("," if len(value) else "") + json.dumps(first) + (" : " if spaces else ":") + "1}"
    with pytest.raises(ArgumentError, match="duplicate member name"):
        parse_arguments(repeated, ArgumentLimits())


def test_argument_limits_name_themselves() -> None:
    limits = ArgumentLimits(max_depth=3, max_items=5, max_string=4)
    assert parse_arguments('{"a": [[1]]}', limits)[0] == {"a": [[1]]}
    for text, name in [
        ('{"a": [[[1]]]}', "max_argument_depth (3)"),
        ('{"a": [1, 2, 3, 4, 5]}', "max_argument_items (5)"),
        ('{"a": "12345"}', "max_argument_string (4)"),
        ('{"abcde": 1}', "max_argument_string (4)"),
        ("[" * 2000 + "]" * 2000, "max_argument_depth (3)"),
    ]:
        with pytest.raises(ArgumentError, match=re.escape(name)):
            parse_arguments(text, limits)
    _, spent = parse_arguments('{"a": [1, 2]}', limits)
    with pytest.raises(ArgumentError, match="max_argument_items"):
        parse_arguments('{"a": [1]}', limits, spent + 2)  # what a batch's earlier requests used counts


def test_exec_argv_is_bounded_like_arguments(core: Core) -> None:
    core.limits = ArgumentLimits(max_items=3, max_string=5)
    service = EnforcerService(core, pb.StatusResponse)
    for argv in (["a", "b", "c", "d"], ["abcdef"]):
        request = pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=argv))
        with pytest.raises(ApiError, match=r"max_argument_items \(3\).*max_argument_string \(5\)"):
            service.core.check(request, ROOT)
    ok = service.core.check(pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["ls", "-l"])), ROOT)
    assert ok.decision in (pb.ALLOW, pb.DENY, pb.ASK)
