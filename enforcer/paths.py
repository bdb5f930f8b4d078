"""Default locations for state the enforcer writes: system paths for root, XDG paths otherwise.

Each function is given the environment to read XDG_* from (the command's; nothing here reads
os.environ). The ADL_ENFORCER_* settings that move these locations are in enforcer/settings.py."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def state_dir(environ: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/adl-enforcer")
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "adl-enforcer"


def audit_dir(environ: Mapping[str, str]) -> Path:
    if os.geteuid() == 0:
        return Path("/var/log/adl-enforcer")
    return state_dir(environ) / "audit"


def audit_key_path(environ: Mapping[str, str]) -> Path:
    """The checkpoint signing key lives apart from the log so that write access to the log alone
    cannot re-seal an edited log."""
    return state_dir(environ) / "audit-signing-key.pem"


def cache_dir(environ: Mapping[str, str]) -> Path:
    """Where compiled policies are cached: root's cache is in /var/cache, a user's in their XDG
    cache directory."""
    if os.geteuid() == 0:
        return Path("/var/cache/adl-enforcer/policies")
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "adl-enforcer" / "policies"


def runtime_dir(environ: Mapping[str, str]) -> Path:
    """Where adl-enforcerd's sockets and lock files are by default."""
    return Path("/run/adl-enforcer") if os.geteuid() == 0 else state_dir(environ) / "run"
