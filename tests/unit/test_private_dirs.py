"""enforcer/paths.py's make_private_dir: what it creates passes the check it runs after."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from enforcer.paths import make_private_dir


def test_directories_created_above_the_named_one_take_its_mode_whatever_the_umask(tmp_path: Path) -> None:
    """With umask 002 (many distributions' default for users), directories made with the default
    mode are group-writable: the ones created on the way must not be, or the check that follows
    refuses the log or cache directory just made."""
    named = tmp_path / "state" / "adl-enforcer" / "audit"
    previous = os.umask(0o002)
    try:
        make_private_dir(named, 0o750)
    finally:
        os.umask(previous)
    for path in (tmp_path / "state", tmp_path / "state" / "adl-enforcer", named):
        assert stat.S_IMODE(path.stat().st_mode) == 0o750, path
