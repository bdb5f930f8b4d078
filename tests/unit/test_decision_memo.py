"""The daemon core's memo of what follows from a shared decision (its record members and the encoded
decision part of its answer): keyed by (agent, tool), right after a reload whether the new decision
equals the old one or not, right for each of two agents, and bounded."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType, SimpleNamespace
from typing import Any

import orjson
import pytest

from enforcer.audit import WriterSettings, records
from enforcer.daemon import core as core_module
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions
from enforcer.policy.model import Decision, Reason, ToolCall
from enforcer.v1 import enforcer_pb2 as pb

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "examples" / "coding-agent.adl.json"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def core(tmp_path: Path, schemas: Any) -> Iterator[Core]:
    policies = tmp_path / "policies"
    policies.mkdir()
    shutil.copy(EXAMPLE, policies)
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    sink = AuditSink(tmp_path / "audit", tmp_path / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        yield Core(store, sink, SessionRegistry(), Approvals(_now_ms, 10), _now_ms)
    finally:
        sink.close()


def _read_file(agent: str) -> pb.CheckRequest:
    return pb.CheckRequest(agent=agent, tool=pb.ToolCall(name="read_file", arguments_json=b'{"path": "src/a.py"}'))


def _ask(core: Core, agent: str) -> tuple[pb.CheckResponse, dict[str, Any]]:
    """One read_file Check by the encoded (inline) path and the record written for it."""
    ((status, _, body),) = core.check_answers([_read_file(agent)], [b"unix:"])
    assert status == core_module._STATUS.OK
    answer = pb.CheckResponse.FromString(body)
    lines = b"".join(p.read_bytes() for p in sorted(core.sink.directory.glob("*.jsonl"))).splitlines()
    record = next(r for r in map(orjson.loads, reversed(lines)) if records.kind_of(r) == records.DECISION)
    assert record["payload"]["decision_id"] == answer.decision_id
    return answer, record


def _shared(core: Core, agent: str) -> Decision:
    entry = core.store.snapshot.resolve(agent)
    assert entry is not None
    return entry.policy.tool_allowed["read_file"]


def _rewrite(path: Path, change: Any = None) -> None:
    document = json.loads(path.read_text())
    if change is not None:
        change(document)
    path.write_text(json.dumps(document, indent=1))  # other bytes, so the store compiles it again


def test_an_equal_decision_after_a_reload_takes_the_place_of_the_old_one(core: Core) -> None:
    answer, record = _ask(core, "Coding Agent")
    before = _shared(core, "Coding Agent")
    _rewrite(core.store.directory / EXAMPLE.name)  # the same document in other bytes
    assert core.store.reload().changed == ("Coding Agent",)
    after = _shared(core, "Coding Agent")
    assert after == before and after is not before
    again, record_again = _ask(core, "Coding Agent")
    assert list(core._derived) == [("Coding Agent", "read_file")]
    assert core._derived["Coding Agent", "read_file"].decision is after
    unchanged = ("agent", "decision", "rules", "reasons", "obligations", "policy_digest", "action", "tool")
    assert {k: record_again["payload"][k] for k in unchanged} == {k: record["payload"][k] for k in unchanged}
    assert (again.decision, again.policy_digest, again.agent) == (answer.decision, answer.policy_digest, answer.agent)


def test_a_different_decision_after_a_reload_is_recorded_and_answered_as_itself(core: Core) -> None:
    answer, _ = _ask(core, "Coding Agent")
    path = core.store.directory / EXAMPLE.name
    _rewrite(path, lambda d: d.update(version="0.9.1"))
    assert core.store.reload().changed == ("Coding Agent",)
    changed = _shared(core, "Coding Agent")
    assert changed.policy_digest != answer.policy_digest
    again, record_again = _ask(core, "Coding Agent")
    assert again.policy_digest == record_again["payload"]["policy_digest"] == changed.policy_digest
    assert core._derived["Coding Agent", "read_file"].decision is changed
    # and once more from the memo, now holding the new decision
    third, record_third = _ask(core, "Coding Agent")
    assert third.policy_digest == record_third["payload"]["policy_digest"] == changed.policy_digest


def test_two_agents_with_the_same_tool_each_get_their_own_parts(core: Core) -> None:
    twin = json.loads(EXAMPLE.read_text())
    twin["name"] = "Coding Twin"
    (core.store.directory / "twin.adl.json").write_text(json.dumps(twin))
    assert not core.store.reload().snapshot.problems
    for _ in range(2):  # built, then from the memo
        first, first_record = _ask(core, "Coding Agent")
        second, second_record = _ask(core, "Coding Twin")
        assert (first.agent, first_record["payload"]["agent"]) == ("Coding Agent", "Coding Agent")
        assert (second.agent, second_record["payload"]["agent"]) == ("Coding Twin", "Coding Twin")
        assert first.policy_digest != second.policy_digest
        assert second_record["payload"]["policy_digest"] == second.policy_digest
    assert sorted(core._derived) == [("Coding Agent", "read_file"), ("Coding Twin", "read_file")]


def _entry(key: str, decision: Decision) -> Any:
    policy = SimpleNamespace(agent_id=None, agent_name=key, tool_allowed=MappingProxyType({"t": decision}))
    return SimpleNamespace(key=key, policy=policy)


def _decision(digest: str) -> Decision:
    return Decision("ALLOW", (Reason("tool.allowed", "/tools/0", "declared"),), MappingProxyType({}), digest)


def test_the_memo_stays_bounded(core: Core) -> None:
    for n in range(100):  # reloads of one agent: one entry, always the newest decision
        decision = _decision(f"d{n}")
        derived = core._derive(_entry("a", decision), ToolCall("t"), decision)
        assert derived.decision is decision and derived.members["policy_digest"] == f"d{n}"
    assert len(core._derived) == 1
    for n in range(core_module._DERIVED_MAX + 10):  # many agents
        decision = _decision("d")
        core._derive(_entry(f"agent-{n}", decision), ToolCall("t"), decision)
        assert len(core._derived) <= core_module._DERIVED_MAX
    # a decision that is not the policy's shared one is derived for its call alone
    unshared = _decision("own")
    derived = core._derive(_entry("b", _decision("shared")), ToolCall("t"), unshared)
    assert derived.decision is unshared and ("b", "t") not in core._derived
