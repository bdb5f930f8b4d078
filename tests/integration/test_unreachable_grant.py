"""A grant the agent's identity cannot reach (a directory private to root) refuses the launch with
a message naming the path: Landlock rules are added as that identity, never as root."""

from __future__ import annotations

import json

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root


def test_a_grant_beneath_a_private_directory_is_refused_naming_it_and_a_reachable_one_runs(sandbox: Sandbox) -> None:
    private = sandbox.root / "root-only"
    private.mkdir(mode=0o700)
    (private / "data.txt").write_text("ROOT-ONLY\n")
    permissions = json.loads(json.dumps(sandbox.permissions))
    permissions["filesystem"]["allowed_paths"].append({"path": str(private / "data.txt"), "access": "read"})
    policy = sandbox.policy(permissions=permissions)

    refused = sandbox.run("cat", str(private / "data.txt"), policy=policy)
    assert refused.code != 0 and "ROOT-ONLY" not in refused.out
    assert f"the policy grants {private / 'data.txt'}, which the agent's identity (uid 65534) cannot reach" in (
        refused.err
    ), refused.err

    private.chmod(0o755)  # control: the same policy, the directory now reachable
    allowed = sandbox.run("cat", str(private / "data.txt"), policy=policy)
    assert allowed.code == 0 and allowed.out == "ROOT-ONLY\n", allowed.err
