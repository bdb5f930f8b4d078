"""An operator names the same directory by two spellings: a grant through a symbolic link and a
denied path by its real path, or the other way round. The kernel follows the link when it applies
the grant; the denied path must hold under either spelling, or the launch must be refused."""

from __future__ import annotations

import textwrap

import pytest

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = needs_root

READ_SECRET = """
try:
    print("ESCAPED" if "DENIED-CONTENT" in open({path!r}).read() else "BLOCKED masked")
except OSError as exc:
    print("BLOCKED", exc.errno)
"""


@pytest.mark.parametrize("spelled_through_the_link", ["allowed", "denied"])
def test_a_denied_path_holds_when_a_grant_names_it_through_a_symlink(
    sandbox: Sandbox, spelled_through_the_link: str
) -> None:
    link = sandbox.root / "link"
    link.symlink_to(sandbox.ws)
    fs = sandbox.permissions["filesystem"]
    if spelled_through_the_link == "allowed":
        fs["allowed_paths"][0]["path"] = f"{link}/**"
    else:
        fs["denied_paths"] = [f"{link}/secret.txt"]
    result = sandbox.python(textwrap.dedent(READ_SECRET.format(path=str(sandbox.ws / "secret.txt"))))
    if result.code == 125:  # refused at launch: the operator is told, nothing is weakened
        assert "refused" in result.err, result.err
        return
    assert "BLOCKED" in result.out and "ESCAPED" not in result.out, result.out + result.err
