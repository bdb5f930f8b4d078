"""A hostile API caller names a tool (or passes arguments) made of terminal controls: C1 CSI, which
a UTF-8 terminal such as xterm obeys, and a bidi override, which reorders what the auditor reads.
The daemon records the name as given; every adl-audit output an auditor reads on a terminal must
show such characters escaped, JSON output included (where an escape keeps the value the same)."""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from enforcer.audit import WriterSettings
from enforcer.cli.audit import main as audit_main
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions
from enforcer.v1 import enforcer_pb2 as pb

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
# CSI 2J (clear the screen) and CSI 31m in their 8-bit form, a right-to-left override, a line
# separator, DEL and a tag character outside the Basic Multilingual Plane.
HOSTILE = "read_file\u009b2J\u009b31mALLOW\u202eyrtne\u2028\x7f\U000e0041"
CONTROLS = ("\u009b", "\u202e", "\u2028", "\x7f", "\U000e0041")


def _now_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


@contextlib.contextmanager
def _core(directory: Path, schemas: Any) -> Iterator[Core]:
    policies = directory / "policies"
    policies.mkdir()
    shutil.copy(EXAMPLES / "coding-agent.adl.json", policies)
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    sink = AuditSink(directory / "audit", directory / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        yield Core(store, sink, SessionRegistry(), Approvals(_now_ms, 10), _now_ms)
    finally:
        sink.close()


@pytest.fixture
def hostile_log(tmp_path: Path, schemas: Any) -> tuple[Path, int]:
    with _core(tmp_path, schemas) as core:
        answer = core.check(
            pb.CheckRequest(
                agent="Coding Agent",
                tool=pb.ToolCall(name=HOSTILE, arguments_json=orjson.dumps({HOSTILE: HOSTILE})),
            )
        )
        assert answer.decision == pb.DENY
        directory = core.sink.directory
    found = [
        orjson.loads(line)
        for path in sorted(directory.glob("audit-*.jsonl"))
        for line in path.read_bytes().splitlines()
        if HOSTILE.encode() in line
    ]
    assert found and found[0]["payload"]["tool"] == HOSTILE  # recorded as given
    return directory, found[0]["seq"]


def _run(directory: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert audit_main(["--dir", str(directory), *argv]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "{seq}"),
        ("show", "{seq}", "--json"),
        ("search", "--json"),
        ("search",),
        ("report",),
        ("report", "--json"),
    ],
)
def test_controls_a_caller_chose_reach_the_terminal_escaped(
    hostile_log: tuple[Path, int], capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    directory, seq = hostile_log
    out = _run(directory, capsys, *(a.format(seq=seq) for a in argv))
    assert "read_file" in out
    for control in CONTROLS:
        assert control not in out, (argv, control)
    if "--json" in argv:  # still JSON, naming the same tool
        values = [json.loads(line) for line in out.splitlines()] if argv[0] == "search" else [json.loads(out)]
        if argv[0] != "report":
            assert any(v["payload"].get("tool") == HOSTILE for v in values)
        else:
            assert HOSTILE in values[0]["by_tool"]
