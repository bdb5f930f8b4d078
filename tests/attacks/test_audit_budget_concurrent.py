"""Requests of one uid decided together (the inline loop's batch of concurrent Checks) must not
each find the budget unspent: the records of the first are charged before the next is taken, or
a uid whose records are far larger than its requests (characters JSON escapes at six bytes for
one) writes several times its budget in one batch."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from enforcer.daemon.callers import Caller
from enforcer.daemon.inline import MAX_BATCH
from enforcer.daemon.messages import ApiError
from enforcer.daemon.quota import UidBudget
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.budgeted_core import budgeted_core, log_bytes

CALLER = Caller(pid=1, uid=4243, gid=4243, groups=())
BUDGET = 256 << 10


@pytest.mark.parametrize("batches", [1, 3])
def test_checks_decided_together_stay_within_the_uids_budget(tmp_path: Path, schemas: Any, batches: int) -> None:
    budget = UidBudget(BUDGET, 3600.0, exempt=frozenset({0}))
    with budgeted_core(tmp_path, schemas, budget, CALLER.uid) as (core, sink, audit):
        request = pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["sh", "\x01" * 16_000]))
        sink.sync()
        start = log_bytes(audit)
        answers: list[Any] = []
        for _ in range(batches):
            answers += core.check_many([request] * MAX_BATCH, [CALLER] * MAX_BATCH)
        sink.sync()
        grown = log_bytes(audit) - start
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


def test_checks_and_explains_on_concurrent_threads_stay_near_the_uids_budget(tmp_path: Path, schemas: Any) -> None:
    """gRPC's worker threads (Explain always, Check with inline_check off) decide one uid's requests
    at once: each took its request's size and found the budget unspent by the others until their
    records were written and charged: several times the budget in all."""
    budget = UidBudget(BUDGET, 3600.0, exempt=frozenset({0}))
    decided: list[int] = []
    with budgeted_core(tmp_path, schemas, budget, CALLER.uid) as (core, sink, audit):
        request = pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["sh", "\x01" * 16_000]))
        sink.sync()
        start = log_bytes(audit)
        barrier = threading.Barrier(16)

        def worker(explain: bool) -> None:
            barrier.wait()
            for _ in range(4):
                try:
                    if explain:
                        entry, session = core.caller(request.agent, "", "", CALLER)
                        core.decide_for(entry, session, request, dry_run=True, who=CALLER)
                    else:
                        core.check(request, CALLER)
                    decided.append(1)
                except ApiError as exc:
                    assert exc.code.name == "RESOURCE_EXHAUSTED", exc

        threads = [threading.Thread(target=worker, args=(n % 2 == 0,)) for n in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sink.sync()
        grown = log_bytes(audit) - start
    assert decided
    print(f"{len(decided)} of 64 decided wrote {grown} bytes for a budget of {BUDGET}")
    # A thread may still be switched out between its take and its record's charge: a record or two
    # beyond the budget, never several times it.
    one_record = grown // len(decided)
    assert grown <= BUDGET + 3 * one_record, f"{len(decided)} decided wrote {grown} bytes for a budget of {BUDGET}"
