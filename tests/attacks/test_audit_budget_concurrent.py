"""Requests of one uid decided together (the inline loop's batch of concurrent Checks) must not
each find the budget unspent: the records of the first are charged before the next is taken, or
a uid whose records are far larger than its requests (characters JSON escapes at six bytes for
one) writes several times its budget in one batch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import WriterSettings
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.callers import Caller
from enforcer.daemon.core import Core
from enforcer.daemon.inline import MAX_BATCH
from enforcer.daemon.messages import ApiError
from enforcer.daemon.quota import UidBudget
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions
from enforcer.v1 import enforcer_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
CALLER = Caller(pid=1, uid=4243, gid=4243, groups=())
BUDGET = 256 << 10


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _log_bytes(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@pytest.mark.parametrize("batches", [1, 3])
def test_checks_decided_together_stay_within_the_uids_budget(tmp_path: Path, schemas: Any, batches: int) -> None:
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "coding-agent.adl.json").write_bytes((EXAMPLES / "coding-agent.adl.json").read_bytes())
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    audit = tmp_path / "audit"
    sink = AuditSink(audit, tmp_path / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    budget = UidBudget(BUDGET, 3600.0, exempt=frozenset({0}))
    try:
        core = Core(
            store,
            sink,
            SessionRegistry(),
            Approvals(_now_ms, 10),
            _now_ms,
            agent_callers={"*": [f"uid:{CALLER.uid}"]},
            budget=budget,
        )
        request = pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["sh", "\x01" * 16_000]))
        sink.sync()
        start = _log_bytes(audit)
        answers: list[Any] = []
        for _ in range(batches):
            answers += core.check_many([request] * MAX_BATCH, [CALLER] * MAX_BATCH)
        sink.sync()
        grown = _log_bytes(audit) - start
    finally:
        sink.close()
    decided = [a for a in answers if not isinstance(a, ApiError)]
    refused = [a for a in answers if isinstance(a, ApiError)]
    assert decided and refused
    assert all(e.code.name == "RESOURCE_EXHAUSTED" for e in refused), refused[0]
    # The budget, plus the one record that found it not yet spent, the record that says the uid's
    # refusals begin and the log's framing: as many Checks one after the other.
    one_record = grown // (len(decided) + 1)
    assert grown <= BUDGET + one_record + 16 * 1024, (
        f"{len(decided)} of {len(answers)} Checks decided together wrote {grown} bytes for a budget of {BUDGET}"
    )
    assert budget.used(CALLER.uid, time.monotonic()) >= grown - 16 * 1024
