"""An operator leaves the daemon's policy directory (or one above it, or a document in it) writable
by another user: a group-writable deploy directory, a directory below a shared one, a document
copied in by someone else. Without signatures required, whoever may write there rewrites an
agent's grants at the next reload. The daemon refuses it, naming the path and what is wrong: at
start it does not start; on a reload it keeps what it loaded while the directory was safe."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from enforcer.daemon.store import PolicyStore, UnsafePolicyDirectory
from enforcer.policy import CompileOptions

from ..helpers.daemon import RunningDaemon
from ..helpers.sandbox import Sandbox

EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
DOCUMENT = "coding-agent.adl.json"
OTHER_UID = 65534

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="hands files to another uid")


def _policies(parent: Path) -> Path:
    policies = parent / "policies"
    policies.mkdir(mode=0o755)
    shutil.copy(EXAMPLES / DOCUMENT, policies)
    return policies


def _store(policies: Path, schemas: Any) -> PolicyStore:
    return PolicyStore(policies, schemas, CompileOptions(require_signature=False))


def _grant_everything(document: Path) -> None:
    """What a member of the directory's group writes: every tool an agent could ask for."""
    doc = json.loads(document.read_text())
    doc["tools"] = [*doc["tools"], {"name": "rm_everything", "description": "added", "parameters": {"type": "object"}}]
    document.write_text(json.dumps(doc))


def test_a_group_writable_policy_directory_is_refused(tmp_path: Path, schemas: Any) -> None:
    policies = _policies(tmp_path)
    policies.chmod(0o775)
    store = _store(policies, schemas)
    with pytest.raises(UnsafePolicyDirectory, match=f"{policies} is writable by group or others"):
        store.check_directory()
    snapshot = store.reload().snapshot
    assert not snapshot.agents
    assert [(p.path, p.detail) for p in snapshot.problems] == [
        (str(policies), f"policy directory refused: {policies} is writable by group or others")
    ]


@needs_root
def test_a_policy_directory_below_another_users_directory_is_refused(tmp_path: Path, schemas: Any) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    policies = _policies(shared)
    os.chown(shared, OTHER_UID, OTHER_UID)  # its owner can rename policies/ away and put its own there
    snapshot = _store(policies, schemas).reload().snapshot
    assert not snapshot.agents
    assert f"{shared} is owned by uid {OTHER_UID}" in snapshot.problems[0].detail


@needs_root
def test_a_document_another_user_owns_or_may_write_is_refused(tmp_path: Path, schemas: Any) -> None:
    policies = _policies(tmp_path)
    document = policies / DOCUMENT
    os.chown(document, OTHER_UID, OTHER_UID)
    snapshot = _store(policies, schemas).reload().snapshot
    assert not snapshot.agents
    problems = [(p.path, p.detail) for p in snapshot.problems]
    assert problems == [(str(document), f"{document} is owned by uid {OTHER_UID}")]
    os.chown(document, 0, 0)
    document.chmod(0o666)
    snapshot = _store(policies, schemas).reload().snapshot
    assert not snapshot.agents and snapshot.problems[0].detail == f"{document} is writable by group or others"


def test_a_reload_of_a_directory_made_unsafe_keeps_what_was_loaded(tmp_path: Path, schemas: Any) -> None:
    policies = _policies(tmp_path)
    store = _store(policies, schemas)
    before = store.reload().snapshot
    (entry,) = before.agents.values()
    assert "rm_everything" not in json.dumps(entry.adl_document)
    policies.chmod(0o777)  # an operator's chmod; then someone else edits a document
    _grant_everything(policies / DOCUMENT)
    after = store.reload()
    assert after.snapshot.agents[entry.key] is entry and after.changed == ()
    assert after.snapshot.problems[0].detail == (
        f"policy directory refused: {policies} is writable by group or others: the 1 agent(s) loaded before are kept"
    )
    policies.chmod(0o755)  # fixed: the edit now counts as the operator's own
    assert "rm_everything" in json.dumps(store.reload().snapshot.agents[entry.key].adl_document)


@pytest.mark.daemon
@needs_root
def test_the_daemon_does_not_start_on_an_unsafe_policy_directory(agent_tmp_path: Path) -> None:
    daemon = RunningDaemon(agent_tmp_path, Sandbox(agent_tmp_path / "box"))
    daemon.write_agents()
    daemon.policies.chmod(0o770)
    try:
        daemon.start(wait=False)
        assert daemon.proc is not None
        assert daemon.proc.wait(timeout=30) == 1
    finally:
        daemon.cleanup()
    refusal = f"policy directory {daemon.policies} refused: {daemon.policies} is writable by group or others"
    assert f"cannot start: {refusal}" in daemon.log.read_text()
    assert not daemon.api.exists()
