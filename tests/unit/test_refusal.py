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
