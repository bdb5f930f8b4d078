"""Default locations for state the enforcer writes: system paths for root, XDG state paths otherwise.
Every default can be overridden by an ADL_ENFORCER_* environment variable."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/adl-enforcer")
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "adl-enforcer"


def audit_dir() -> Path:
    configured = os.environ.get("ADL_ENFORCER_AUDIT_DIR")
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/log/adl-enforcer")
    return state_dir() / "audit"


def audit_key_path() -> Path:
    """The checkpoint signing key lives apart from the log so that write access to the log alone
    cannot re-seal an edited log."""
    configured = os.environ.get("ADL_ENFORCER_AUDIT_KEY")
    return Path(configured) if configured else state_dir() / "audit-signing-key.pem"


def cache_dir() -> Path | None:
    """Where compiled policies are cached (None: no cache). Root's cache is in /var/cache, a
    user's in their XDG cache directory; ADL_ENFORCER_CACHE_DIR moves it, 'off' turns it off."""
    configured = os.environ.get("ADL_ENFORCER_CACHE_DIR")
    if configured == "off":
        return None
    if configured:
        return Path(configured)
    if os.geteuid() == 0:
        return Path("/var/cache/adl-enforcer/policies")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "adl-enforcer" / "policies"
