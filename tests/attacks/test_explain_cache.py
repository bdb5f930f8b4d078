"""The daemon's Explain keeps what a document's runtime presets grant per catalog file identity: a
catalog rewritten in place, to the same size and with its modification time put back (`cp -p`,
`touch -r`, an unpacked archive), must not leave a reviewer shown the grants of the old one while
launches apply the new."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from enforcer.audit import WriterSettings
from enforcer.daemon.approvals import Approvals
from enforcer.daemon.auditsink import AuditSink
from enforcer.daemon.core import Core
from enforcer.daemon.registry import SessionRegistry
from enforcer.daemon.service import EnforcerService
from enforcer.daemon.store import PolicyStore
from enforcer.data import PRESETS
from enforcer.policy import CompileOptions
from enforcer.v1 import enforcer_pb2 as pb

EXAMPLE = Path(__file__).resolve().parents[2] / "policies" / "examples" / "coding-agent.adl.json"


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_catalog_rewritten_with_its_size_and_time_kept_is_read_again(tmp_path: Path, schemas: Any) -> None:
    catalog = tmp_path / "presets.yaml"
    shutil.copy(PRESETS, catalog)
    document = json.loads(EXAMPLE.read_text())
    document["permissions"]["extensions"] = {"adl-enforcer.runtime": {"presets": ["python"]}}
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "agent.adl.json").write_text(json.dumps(document))
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

        def shown() -> list[str]:
            answer = service.Explain(request, None)  # type: ignore[arg-type]  # admin: no peer to look up
            lines: list[str] = orjson.loads(answer.policy_json)["runtime_presets"]
            return lines

        before = shown()
        assert any("/usr/lib/python3" in line for line in before), before
        text = catalog.read_text()
        assert text.count("    - /usr/lib/python3\n") == 1
        stat = catalog.stat()
        with open(catalog, "r+") as f:  # in place: the same inode
            f.write(text.replace("    - /usr/lib/python3\n", "    - /usr/lib/pythonX\n"))
        os.utime(catalog, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        assert catalog.stat().st_size == stat.st_size and catalog.stat().st_ino == stat.st_ino
        after = shown()
        # What a launch now applies: the path is gone (one that does not exist is skipped), and the
        # catalog's digest is the new file's.
        assert not any("/usr/lib/python3" in line for line in after), after
        assert after[0] != before[0]
    finally:
        sink.close()
