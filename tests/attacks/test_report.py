"""What the agent can put in front of the operator: adl-exec --report and adl-audit print names the
agent chose (its command name, paths it touched) on the operator's terminal."""

from __future__ import annotations

import contextlib
import io
import textwrap

from enforcer.cli.audit import main as audit_main

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

# The command name is the agent's to set (prctl PR_SET_NAME, 15 bytes): a terminal escape and a line
# break that would start a forged line. The denial then carries it; so does the refused creation of a
# denied name (*.pem) the agent spells the same way.
FORGE = """
import ctypes, os
ctypes.CDLL(None).prctl(15, b"\\x1b[2J\\nFORGED\\r", 0, 0, 0)
try:
    os.listdir({outside!r})
except PermissionError:
    print("BLOCKED")
try:
    open({workspace!r} + "/\\x1b[2J\\nFORGED-NAME\\r.pem", "w")
except PermissionError:
    print("REFUSED")
"""


def forge(sandbox: Sandbox) -> str:
    """Run an agent that names itself with an escape and a line break and is denied once; its stderr."""
    result = sandbox.python(textwrap.dedent(FORGE.format(outside=str(sandbox.outside), workspace=str(sandbox.ws))))
    assert "BLOCKED" in result.out and "REFUSED" in result.out, result.out + result.err
    return result.err


def assert_nothing_forged(text: str) -> None:
    assert "\x1b" not in text and "\r" not in text, repr(text)
    assert not any(line.startswith("FORGED") for line in text.splitlines()), text


def test_the_report_carries_no_control_characters_from_the_agent(sandbox: Sandbox) -> None:
    err = forge(sandbox)
    denial = [line for line in err.splitlines() if str(sandbox.outside) in line]
    assert denial, "the Landlock denial is not in the report: " + err
    assert_nothing_forged(err)
    assert all(line.startswith("adl-exec: ") for line in err.splitlines()), err


def test_the_audit_tools_print_no_control_characters_from_the_agent(sandbox: Sandbox) -> None:
    forge(sandbox)
    for command in (["search"], ["report"]):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = audit_main(["--dir", str(sandbox.audit), *command])
        assert code == 0, out.getvalue()
        assert "FORGED-NAME" in out.getvalue(), out.getvalue()  # the refusal is listed, escaped
        assert_nothing_forged(out.getvalue())
