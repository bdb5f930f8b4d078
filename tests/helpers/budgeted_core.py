"""A daemon Core over the example coding agent, with its own audit log and a caller's audit
budget: the attacks on the budget (tests/attacks/test_audit_budget_*.py) each decide through one."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from enforcer.audit import WriterSettings
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.quota import UidBudget
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"


class BudgetedCore(NamedTuple):
    core: Core
    sink: AuditSink
    audit: Path  # the log's directory


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def log_bytes(directory: Path) -> int:
    """Every byte of the audit log's files in `directory`."""
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())


@contextlib.contextmanager
def budgeted_core(tmp_path: Path, schemas: Any, budget: UidBudget, caller_uid: int) -> Iterator[BudgetedCore]:
    """A Core deciding for the coding agent, for `caller_uid` (and root), charging `budget`; its
    audit sink is closed when the block ends, however it ends."""
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "coding-agent.adl.json").write_bytes((EXAMPLES / "coding-agent.adl.json").read_bytes())
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    audit = tmp_path / "audit"
    sink = AuditSink(audit, tmp_path / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        core = Core(
            store,
            sink,
            SessionRegistry(),
            Approvals(now_ms, 10),
            now_ms,
            agent_callers={"*": [f"uid:{caller_uid}"]},
            budget=budget,
        )
        yield BudgetedCore(core, sink, audit)
    finally:
        sink.close()
