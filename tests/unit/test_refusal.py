"""One exception base for what makes a load or a launch refuse, so that launchers and the policy
store catch it (with OSError) instead of a list that a new kind of refusal could miss."""

from __future__ import annotations

import pytest

from enforcer.documents import PolicyFileError
from enforcer.policy.errors import DocumentRejected, Refusal
from enforcer.sandbox.plan import PlanError


@pytest.mark.parametrize(
    "error",
    [PolicyFileError("agent.adl.json", "unreadable"), DocumentRejected([]), PlanError("no Landlock")],
    ids=["file", "document", "plan"],
)
def test_every_refusal_is_caught_by_the_one_base(error: Exception) -> None:
    with pytest.raises(Refusal) as caught:
        raise error
    assert str(caught.value) == str(error)


def test_a_refusal_is_printed_with_its_control_characters_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    """adl-exec's refusals carry names others chose: a path, the daemon's reason, the detail of a
    session's end (through the daemon); printed raw, they could clear the screen or forge a line."""
    from enforcer.cli.exec_common import EXIT_REFUSED, refuse

    assert refuse("cannot read /tmp/\x1b[2J\nFORGED\r.adl.json") == EXIT_REFUSED
    err = capsys.readouterr().err
    assert err == "adl-exec: refused: cannot read /tmp/\\x1b[2J\\nFORGED\\r.adl.json\n"
