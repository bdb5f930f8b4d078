"""What lies on the way to a directory the enforcer writes or trusts, beyond the path as named.

check_private refuses another user's symlink on the named path and checks the directories of the
path that path resolves to. The kernel walks more than these: a link's target is a path of its own,
which may go through another user's symlink, or through a directory another user may write (who
can then swap the link for one of theirs at any time). The operator's own link into /tmp, or into a
shared deploy directory, is enough: whoever owns what the link goes through chooses where the
root-owned log is written and which documents the daemon reads.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from enforcer.audit import AuditUnavailable, AuditWriter
from enforcer.daemon.store import PolicyStore
from enforcer.paths import check_private, check_private_file
from enforcer.policy import CompileOptions

OTHER_UID = 65534
EXAMPLES = Path(__file__).resolve().parents[2] / "policies" / "examples"
DOCUMENT = "coding-agent.adl.json"

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="hands a symlink to another uid")


def _sticky(parent: Path) -> Path:
    shared = parent / "sticky"
    shared.mkdir()
    shared.chmod(0o1777)
    return shared


def _theirs(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    os.chown(link, OTHER_UID, OTHER_UID, follow_symlinks=False)
    return link


@needs_root
def test_a_log_directory_reached_through_another_users_symlink_behind_ones_own_is_refused(tmp_path: Path) -> None:
    """The operator's link /var/log/adl -> /tmp/adl-audit, where another user made /tmp/adl-audit a
    symlink to a directory of root's first."""
    target = tmp_path / "roots-dir"
    target.mkdir()
    theirs = _theirs(_sticky(tmp_path) / "adl-audit", target)
    ours = tmp_path / "audit-link"
    ours.symlink_to(theirs)
    with pytest.raises(AuditUnavailable, match=f"{theirs} is a symlink of uid {OTHER_UID}"):
        AuditWriter(ours, tmp_path / "key" / "audit.pem").close()
    assert list(target.iterdir()) == []
    (target / "sub").mkdir()
    with pytest.raises(PermissionError, match=f"{theirs} is a symlink of uid {OTHER_UID}"):
        check_private(ours / "sub")  # a component after the links: the same walk


@needs_root
def test_a_link_in_a_directory_another_user_may_write_is_refused(tmp_path: Path) -> None:
    """A root-owned link in a group-writable (not sticky) deploy directory: a member of the group
    renames it away and puts one of theirs there at any moment after the check."""
    target = tmp_path / "roots-dir"
    target.mkdir()
    deploy = tmp_path / "deploy"
    deploy.mkdir()
    deploy.chmod(0o775)
    (deploy / "audit").symlink_to(target)
    with pytest.raises(PermissionError, match=f"{deploy} is writable by group or others"):
        check_private(deploy / "audit")
    with pytest.raises(AuditUnavailable, match=f"{deploy} is writable by group or others"):
        AuditWriter(deploy / "audit", tmp_path / "key" / "audit.pem").close()
    assert list(target.iterdir()) == []


@needs_root
def test_a_policy_document_reached_through_another_users_symlink_is_refused(tmp_path: Path, schemas: Any) -> None:
    """The operator links a document into the policy directory from a shared place; another user's
    symlink on that way picks the file the daemon reads."""
    policies = tmp_path / "policies"
    policies.mkdir(mode=0o755)
    real = tmp_path / "roots-documents"
    real.mkdir()
    shutil.copy(EXAMPLES / DOCUMENT, real)
    theirs = _theirs(_sticky(tmp_path) / "documents", real)
    (policies / DOCUMENT).symlink_to(theirs / DOCUMENT)
    with pytest.raises(PermissionError, match=f"{theirs} is a symlink of uid {OTHER_UID}"):
        check_private_file(policies / DOCUMENT)
    store = PolicyStore(policies, schemas, CompileOptions(require_signature=False))
    snapshot = store.reload().snapshot
    assert not snapshot.agents
    assert f"{theirs} is a symlink of uid {OTHER_UID}" in snapshot.problems[0].detail


def test_links_of_ones_own_through_private_directories_are_accepted(tmp_path: Path) -> None:
    """The walk follows links (relative, absolute, '..' after a link as the kernel reads it) and
    accepts what is private all the way."""
    base = tmp_path / "base"
    (base / "real" / "log").mkdir(parents=True)
    (base / "abs").symlink_to(base / "real")
    (base / "rel").symlink_to("real")
    (base / "real" / "up").symlink_to("../real/log")
    for named in (base / "abs" / "log", base / "rel" / "log", base / "rel" / "up", base / "abs" / "up" / ".." / "log"):
        check_private(named)
    loop = base / "loop"
    loop.symlink_to(loop)
    with pytest.raises(OSError):
        check_private(loop)


def test_an_absolute_path_is_checked_from_a_working_directory_that_is_gone(tmp_path: Path) -> None:
    """adl-exec may be started from a directory removed since: an absolute log directory still
    passes, as it did before links were followed."""
    (tmp_path / "log").mkdir()
    gone = tmp_path / "gone"
    gone.mkdir()
    before = os.getcwd()
    os.chdir(gone)
    try:
        gone.rmdir()
        check_private(tmp_path / "log")
    finally:
        os.chdir(before)
