"""The model behind Claude Code names a file the policy denies in a way the hook reads differently
from the tool: `~/.ssh/id_rsa` joined with the working directory is checked as
<cwd>/~/.ssh/id_rsa (inside an allowed workspace), while a tool that expands `~` reads the home
directory. Such a path is refused, not checked for a path the tool might not use."""

from __future__ import annotations

import pytest

from enforcer.integrations.claude_code import Unmapped, map_tool_use


@pytest.mark.parametrize("tool,key", [("Read", "file_path"), ("Write", "file_path"), ("NotebookEdit", "notebook_path")])
@pytest.mark.parametrize("path", ["~/.ssh/id_rsa", "~root/.ssh/id_rsa", "~"])
def test_a_home_relative_path_is_refused(tool: str, key: str, path: str) -> None:
    event = {"hook_event_name": "PreToolUse", "tool_name": tool, "tool_input": {key: path}, "cwd": "/srv/workspace"}
    with pytest.raises(Unmapped, match="starts with '~'"):
        map_tool_use(event)


def test_control_a_relative_path_is_checked_below_cwd() -> None:
    event = {"tool_name": "Read", "tool_input": {"file_path": "src/a~b.py"}, "cwd": "/srv/workspace"}
    assert map_tool_use(event).action.path == "/srv/workspace/src/a~b.py"
