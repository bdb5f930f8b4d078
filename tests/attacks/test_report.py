"""What the agent can put in front of the operator: adl-exec --report prints names the agent chose
(its command name, paths it touched) on the operator's terminal."""

from __future__ import annotations

import textwrap

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root


def test_the_report_carries_no_control_characters_from_the_agent(sandbox: Sandbox) -> None:
    # The command name is the agent's to set (prctl PR_SET_NAME, 15 bytes): a terminal escape and a
    # line break that would start a forged report line.
    result = sandbox.python(
        textwrap.dedent(
            f"""
            import ctypes, os
            ctypes.CDLL(None).prctl(15, b"\\x1b[2J\\nFORGED\\r", 0, 0, 0)
            try:
                os.listdir({str(sandbox.outside)!r})
            except PermissionError:
                print("BLOCKED")
            """
        )
    )
    assert "BLOCKED" in result.out, result.out + result.err
    denial = [line for line in result.err.splitlines() if str(sandbox.outside) in line]
    assert denial, "the Landlock denial is not in the report: " + result.err
    assert "\x1b" not in result.err and "\r" not in result.err, repr(result.err)
    assert not any(line.startswith("FORGED") for line in result.err.splitlines()), result.err
    assert all(line.startswith("adl-exec: ") for line in result.err.splitlines()), result.err
