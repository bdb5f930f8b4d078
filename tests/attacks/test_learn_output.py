"""A learning run writes the learned policy as root after the agent has run. When the output path
lies in a directory the agent may write (its workspace: the natural place for `--learn
learned.json`), the agent plants a symlink there first, pointing at a file of root's: the learned
document, which quotes names the agent chose (a file named `$(curl ... | sh)` is a command
substitution in a shell startup file), would be written over it."""

from __future__ import annotations

import json
import os

from ..helpers.sandbox import Sandbox, needs_root

pytestmark = [needs_root]


def test_a_symlink_the_agent_planted_at_the_learn_output_is_not_followed(sandbox: Sandbox) -> None:
    box = sandbox
    victim = box.root / "root-shell-rc"
    victim.write_text("# root's shell reads this\n")
    victim.chmod(0o644)
    out = box.ws / "learned.adl.json"
    planted = (
        "import os, pathlib\n"
        f"ws = pathlib.Path({str(box.ws)!r})\n"
        "(ws / '$(touch pwned)').write_text('x')\n"
        f"os.symlink({str(victim)!r}, {str(out)!r})\n"
        "print('planted')\n"
    )
    run = box.python(planted, args=("--learn", str(out)))
    assert "planted" in run.out, run.err
    assert victim.read_text() == "# root's shell reads this\n"  # the target was not written
    assert not out.is_symlink()  # the name now holds the learned document itself
    learned = json.loads(out.read_text())
    assert learned["permissions"]["filesystem"]["allowed_paths"]
    assert out.stat().st_uid == 0  # written by adl-exec, not a file the agent handed over


def test_a_learned_name_that_is_not_utf8_is_recorded_escaped(sandbox: Sandbox) -> None:
    """The agent reads a file whose name is not UTF-8 (the agent's own workspace may hold any name).
    The learn.result record must still be written, the name escaped as \\xNN as denial records do:
    refused by the log's encoder, the run's result would be unconfirmed and the rest unrecorded."""
    box = sandbox
    odd = os.fsencode(box.outside) + b"/odd-\xff\xfe.txt"
    with open(odd, "wb") as f:
        f.write(b"odd\n")
    os.chmod(odd, 0o644)
    out = box.root / "learned.adl.json"
    reader = f"import os\nwith open({odd!r}, 'rb') as f: print('read', f.read())\n"
    run = box.python(reader, args=("--learn", str(out)))
    assert run.code == 0 and "read b'odd\\n'" in run.out, run.err
    result = next(r["payload"] for r in run.records if r["payload"].get("rules") == ["learn.result"])
    escaped = f"{box.outside}/odd-\\xff\\xfe.txt"
    assert [n for n in result["notes"] if n.startswith(f"{escaped} not granted: its name is not UTF-8")], result
    assert escaped in run.err  # the note on stderr too
    # A document cannot hold the name: it is left out (a launch refuses what it cannot record).
    text = out.read_text()
    assert "\\udc" not in text and "odd-" not in text
    assert json.loads(text)["permissions"]["filesystem"]["allowed_paths"]
