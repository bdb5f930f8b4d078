"""The daemon's Explain over one agent document, without a socket: the tests of what it shows of
a document's runtime presets (tests/unit/test_explain_presets.py, tests/attacks/test_explain_cache.py)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import orjson

from enforcer.audit import WriterSettings
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.service import EnforcerService
from enforcer.daemon.store import PolicyStore
from enforcer.policy import CompileOptions
from enforcer.v1 import enforcer_pb2 as pb

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "examples" / "coding-agent.adl.json"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def agent_document(directory: Path, presets: list[str] | None) -> Path:
    """The example coding agent, enabling `presets` (None: no presets extension), as the only
    document in `directory`."""
    document = json.loads(EXAMPLE.read_text())
    if presets is not None:
        document["permissions"]["extensions"] = {"adl-enforcer.runtime": {"presets": presets}}
    directory.mkdir(exist_ok=True)
    path = directory / "agent.adl.json"
    path.write_text(json.dumps(document))
    return path


@contextlib.contextmanager
def explaining(
    tmp_path: Path, schemas: Any, policies: Path, catalog: Path
) -> Iterator[Callable[[], pb.ExplainResponse]]:
    """Explain of the coding agent, on the admin socket's service (root: no peer to look up) of a
    daemon loading `policies` and reading the presets `catalog`; its audit sink is closed when the
    block ends."""
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    assert not store.reload().snapshot.problems
    sink = AuditSink(tmp_path / "audit", tmp_path / "key.pem", WriterSettings(), on_change=lambda ok: None)
    sink.open()
    try:
        core = Core(store, sink, SessionRegistry(), Approvals(_now_ms, 10), _now_ms)
        service = EnforcerService(core, pb.StatusResponse, admin=True, presets_catalog=catalog)
        request = pb.CheckRequest(
            agent="Coding Agent", tool=pb.ToolCall(name="adl-enforcer/explain", arguments_json="{}")
        )
        yield lambda: service.Explain(request, cast(grpc.ServicerContext, None))
    finally:
        sink.close()


def runtime_presets(answer: pb.ExplainResponse) -> list[str]:
    """The lines an Explain answer shows for the document's runtime presets."""
    lines: list[str] = orjson.loads(answer.policy_json)["runtime_presets"]
    return lines
