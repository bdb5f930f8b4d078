"""A caller's audit budget is charged what its decision records cost in the log, not only what its
requests cost on the wire: characters JSON must escape (control characters, six bytes each in the
record for one in the request) must not let one uid write several times its budget."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from enforcer.daemon.callers import Caller
from enforcer.daemon.messages import ApiError
from enforcer.daemon.quota import RECORD_BASE_BYTES, UidBudget
from enforcer.v1 import enforcer_pb2 as pb

from ..helpers.budgeted_core import budgeted_core, log_bytes

CALLER = Caller(pid=1, uid=4242, gid=4242, groups=())
BUDGET = 256 << 10


@pytest.mark.parametrize(
    "request_for",
    [
        lambda text: pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["sh", text])),
        lambda text: pb.CheckRequest(agent="Coding Agent", file=pb.FileAccess(path=text[:4096], mode="read")),
        lambda text: pb.CheckRequest(agent="Coding Agent", exec=pb.ProcessExec(argv=["sh"], resolved_path=text)),
    ],
    ids=["exec.argv", "file.path", "exec.resolved_path"],
)
def test_records_of_escaped_characters_stay_within_the_uids_budget(
    tmp_path: Path, schemas: Any, request_for: Any
) -> None:
    budget = UidBudget(BUDGET, 3600.0, exempt=frozenset({0}))
    with budgeted_core(tmp_path, schemas, budget, CALLER.uid) as (core, sink, audit):
        request = request_for("\x01" * 16_000)
        start = log_bytes(audit)
        core.check(request, CALLER)
        sink.sync()
        before = log_bytes(audit)
        one_record = before - start
        decided, refused = 1, 0
        for _ in range(200):
            try:
                core.check(request, CALLER)
                decided += 1
            except ApiError as exc:
                assert exc.code.name == "RESOURCE_EXHAUSTED", exc
                refused += 1
        sink.sync()
        grown = log_bytes(audit) - before
    assert decided and refused
    # The budget, less the first record, plus one record that found the budget not yet spent and
    # the record that says the uid's refusals begin (and the log's framing).
    assert grown <= BUDGET + 16 * 1024, f"{decided} decisions wrote {grown + one_record} bytes for a budget of {BUDGET}"


def test_the_budget_is_charged_exactly_what_the_records_took_in_the_log(tmp_path: Path, schemas: Any) -> None:
    """Single Checks, a batch and a traced request: each decision costs the uid what _charge took
    before deciding (its request and RECORD_BASE_BYTES) or, when larger, the bytes of its record's
    line as written (envelope, trace and newline included): no more, no less."""
    budget = UidBudget(BUDGET, 3600.0, exempt=frozenset({0}))
    with budgeted_core(tmp_path, schemas, budget, CALLER.uid) as (core, sink, audit):
        plain = pb.CheckRequest(agent="Coding Agent", file=pb.FileAccess(path="src/\x01\u00e9.py", mode="read"))
        traced = pb.CheckRequest(
            agent="Coding Agent",
            exec=pb.ProcessExec(argv=["sh", "-c", "\x02" * 300]),
            trace=pb.TraceContext(traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01", tracestate="k=v"),
        )
        core.check(plain, CALLER)
        core.check(traced, CALLER)
        core.check_batch([plain, traced, plain], CALLER)
        core.check(plain)  # root, exempt: charged to nobody
        sink.sync()
    ours = [
        line
        for f in sorted(audit.glob("audit-*.jsonl"))
        for line in f.read_bytes().splitlines(keepends=True)
        if orjson.loads(line)["payload"].get("caller_uid") == CALLER.uid
    ]
    taken = [r.ByteSize() + RECORD_BASE_BYTES for r in (plain, traced, plain, traced, plain)]
    assert len(ours) == 5
    assert any(len(line) > t for line, t in zip(ours, taken, strict=True)), "a record larger than its take"
    assert any(len(line) < t for line, t in zip(ours, taken, strict=True)), "a record smaller than its take"
    assert budget.used(CALLER.uid, time.monotonic()) == sum(
        max(len(line), t) for line, t in zip(ours, taken, strict=True)
    )
    assert budget.used(0, time.monotonic()) == 0
