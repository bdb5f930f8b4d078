"""adl-approve finds the admin socket where adl-enforcerd puts it, as root and as a user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from enforcer import paths
from enforcer.cli.approve import default_admin_address
from enforcer.daemon.config import Settings


@pytest.mark.parametrize("euid", [0, 1000])
def test_the_default_admin_socket_is_the_daemons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, euid: int) -> None:
    monkeypatch.setattr(paths.os, "geteuid", lambda: euid)
    monkeypatch.delenv("ADL_ENFORCER_ADMIN_SOCKET", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    daemons = Settings.environment_defaults(dict(os.environ))["admin_socket"]
    assert default_admin_address() == f"unix:{daemons}"
    assert (str(daemons).startswith("/run/adl-enforcer/")) == (euid == 0)


def test_the_variable_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADL_ENFORCER_ADMIN_SOCKET", "/tmp/other/admin.sock")
    assert default_admin_address() == "unix:/tmp/other/admin.sock"
