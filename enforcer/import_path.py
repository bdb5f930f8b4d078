"""Where a command may import from while an agent runs.

Root's processes (adl-exec's supervisor, the daemon, the egress filter) and the caller's
(`adl-exec --daemon`) import some modules only when they first need them, which can be after the
agent has started. `python -m` and `-c` put the working directory first on `sys.path` (`-m` as its
path, `-c` as `""`), and an agent may write there: a module it plants would run outside the
sandbox, as root. The commands drop those entries before anything else.
"""

from __future__ import annotations

import os
import sys


def trusted_import_path(path: list[str], working_directory: str) -> list[str]:
    """`path` without the entries that name the working directory (`""`, a relative entry, or the
    directory itself, by any spelling)."""
    return [entry for entry in path if entry and os.path.isabs(entry) and os.path.realpath(entry) != working_directory]


def drop_working_directory() -> None:
    try:
        working = os.path.realpath(os.getcwd())
    except OSError:
        working = ""  # deleted: relative entries are removed all the same
    sys.path[:] = trusted_import_path(sys.path, working)
