"""README's first command, run as CI runs it: the demo's allowed actions work, its denied ones fail
for the reason it names, and the audit trail it prints verifies."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from ..helpers.documents import REPO

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the demo needs root (cgroups, namespaces)")


def test_the_demo_shows_allowed_and_denied_actions_and_a_verified_trail(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ADL_ENFORCER_AUDIT_DIR": str(tmp_path / "audit"),
        "ADL_ENFORCER_AUDIT_KEY": str(tmp_path / "audit-signing-key.pem"),
    }
    done = subprocess.run(
        [str(REPO / "scripts" / "demo.sh")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    # allowed: the workspace code and a granted read
    assert "tests pass" in out
    assert "reference notes" in out
    # denied: a masked file, a file outside the policy, a denied name, another program, a shell
    assert "not-for-agents" not in out
    assert "cat: /tmp/adl-demo/workspace/.env: Permission denied" in out
    assert "cat: /etc/hostname: Permission denied" in out
    assert "Permission denied: '/tmp/adl-demo/workspace/stolen.pem'" in out
    assert not Path("/tmp/adl-demo/workspace/stolen.pem").exists()
    assert "Permission denied: 'curl'" in out
    assert "refused: the command itself is not allowed: 'sh' is a shell" in out
    # why: the kernel's denial of /etc/hostname, found in the audit log with the grant that would allow it
    why = out.split("== why the kernel said no", 1)[1].split("== the research agent", 1)[0]
    assert "no record matches" not in why
    assert "/etc/hostname" in why
    # the network: one allowed host, the rest refused by the egress filter
    assert "allowed  https://en.wikipedia.example.test/" in out
    assert "DENIED   https://other.example.test/" in out
    assert "DENIED   DNS exfiltration" in out
    # the trail
    assert done.stdout.rstrip().endswith("intact"), done.stdout[-2000:]
