"""No PYTHONPATH or PYTHONHOME that anyone but root (the command's user) may write.

The interpreter imports from there at its start (sitecustomize, encodings), before any of the
command's code, and the commands import some modules lazily after: the egress filter (uid 0 in the
host's mount namespace) loads dnspython as an agent's session starts. Named by an operator, an
agent's workspace would have the modules the agent planted there run as root from its next session
on. Refused at the first start, before any agent could plant anything. Checked only when one of
them is set: nothing is imported otherwise."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..paths import check_import_directory

NAMES = ("PYTHONPATH", "PYTHONHOME")


def refuse_untrusted(program: str) -> None:
    """Exit (2) naming each entry of PYTHONPATH or PYTHONHOME that is no directory to import from."""
    problems = [
        f"{name} names {entry!r}: {why}"
        for name in NAMES
        for entry in os.environ.get(name, "").split(os.pathsep)
        if entry and (why := _untrusted(entry))
    ]
    if problems:
        print(
            f"{program}: " + "; ".join(problems) + ". Modules are imported from there, as this "
            "process's user (root: an agent's planted code would run as root); unset it, or name only "
            "directories nobody else may write",
            file=sys.stderr,
        )
        sys.exit(2)


def _untrusted(entry: str) -> str | None:
    """Why `entry` is no directory to import from, None if it is one."""
    if not os.path.isabs(entry):
        return "a relative path, resolved against whatever directory a process is in"
    try:
        check_import_directory(Path(entry))
    except FileNotFoundError:
        return "it does not exist (whoever may create it could fill it)"
    except OSError as exc:  # PermissionError: who owns or may write it, or above it
        return str(exc)
    return None
