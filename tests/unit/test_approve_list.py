"""adl-approve list prints one line per pending approval: arguments too long for it are cut, and the
cut must show, or an approver would take the part shown for the whole call."""

from __future__ import annotations

import json
from typing import Any

from enforcer.cli.approve import _one_line


def _item(arguments: Any) -> dict[str, Any]:
    return {
        "approval_id": "apr-1",
        "agent": "Sandboxed",
        "tool": "run_query",
        "arguments": arguments,
        "session": "",
        "expires_in_s": 60,
    }


def test_cut_arguments_say_so_with_their_full_length() -> None:
    # What the approver reads first looks whole; what decides the call comes after the cut.
    arguments = {"query": "SELECT name FROM users WHERE id = 1" + " " * 40 + "; DROP TABLE users"}
    whole = json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    line = _one_line(_item(arguments))
    assert f"{whole[:77]}… [cut: {len(whole)} characters in all, adl-approve show apr-1]" in line
    assert "DROP TABLE" not in line


def test_arguments_that_fit_are_shown_whole() -> None:
    arguments = {"name": "x" * 60}
    whole = json.dumps(arguments, sort_keys=True, ensure_ascii=False)
    assert len(whole) == 72
    line = _one_line(_item(arguments))
    assert f"run_query {whole}  (expires in 60 s)" in line and "cut" not in line
