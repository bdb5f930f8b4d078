"""The agent's policy grants the directory that holds adl-exec's own audit log and signing key (a
grant on the home directory of the user adl-exec runs as, when that is the agent's user too, or an
operator's broad grant with a key left readable). With the key the agent could re-seal an edited
log; the log holds every session's records. adl-exec hides both from the session, as the daemon
hides its own, whatever the grants say."""

from __future__ import annotations

import os
import textwrap

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root


def test_the_audit_log_and_signing_key_are_hidden_whatever_the_grants(sandbox: Sandbox) -> None:
    key = sandbox.root / "audit-key.pem"
    first = sandbox.run("ls", str(sandbox.ws))  # creates the log and the key
    assert first.code == 0, first.err
    # DAC no longer protects them: as when adl-exec and the agent are one user
    for path in (key, *sandbox.audit.rglob("*")):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    sandbox.audit.chmod(0o755)
    permissions = {
        **sandbox.permissions,
        "filesystem": {
            "allowed_paths": [
                *sandbox.permissions["filesystem"]["allowed_paths"],
                {"path": f"{sandbox.audit}/**", "access": "read"},
                {"path": str(key), "access": "read"},
            ],
        },
    }
    code = textwrap.dedent(
        f"""
        import os
        for path in ({str(key)!r}, {str(sandbox.audit)!r} + "/audit-0000000000000001.jsonl"):
            try:
                data = open(path).read()
                print("ESCAPED" if data else "BLOCKED empty", path)
            except OSError as e:
                print("BLOCKED", e.errno, path)
        """
    )
    result = sandbox.python(code, policy=sandbox.policy(permissions=permissions))
    assert "ESCAPED" not in result.out and result.out.count("BLOCKED") == 2, result.out + result.err
    layers = {layer["name"]: layer for layer in result.record("launch")["payload"]["layers"]}
    assert str(key) in " ".join(layers["own_files"]["details"])
