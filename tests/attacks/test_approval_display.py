"""A hostile caller asks for an approval with arguments made of terminal controls: C1 CSI (which a
UTF-8 terminal such as xterm obeys: it can clear the screen or rewrite what was shown) and a bidi
override (which reorders what the approver reads). adl-approve is where a human decides whether the
call goes through: list, show and watch, JSON included, must show such characters escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from enforcer.client import Client

from ..helpers.daemon import RunningDaemon

pytestmark = [
    pytest.mark.daemon,
    pytest.mark.skipif(os.geteuid() != 0, reason="the daemon needs root (cgroups, namespaces)"),
]

HOSTILE = "notes\u009b2J\u009b1;1Hharmless\u202etxt.exe\u2028\x7f"
CONTROLS = ("\u009b", "\u202e", "\u2028", "\x7f")


def _approve_cli(daemon: RunningDaemon, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "enforcer.cli.approve", "--admin", str(daemon.admin), *args]
    env = {k: v for k, v in os.environ.items() if k != "SUDO_USER"} | {"PYTHONIOENCODING": "utf-8"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env, encoding="utf-8")


def test_controls_in_a_pending_approval_reach_the_approver_escaped(daemon: RunningDaemon) -> None:
    client = Client(f"unix:{daemon.api}", agent="Sandboxed")
    try:
        asked = client.check_tool("delete_note", {"name": HOSTILE})
        assert asked.decision == "ASK" and asked.approval_id
        runs = {
            "list": _approve_cli(daemon, "list"),
            "show": _approve_cli(daemon, "show", asked.approval_id),
            "json list": _approve_cli(daemon, "--json", "list"),
            "json show": _approve_cli(daemon, "--json", "show", asked.approval_id),
            "watch": _approve_cli(daemon, "watch", "--count", "1"),
        }
        for what, run in runs.items():
            assert run.returncode == 0, (what, run.stderr)
            assert "notes" in run.stdout, what
            for control in CONTROLS:
                assert control not in run.stdout, (what, control)
        # JSON output still carries the arguments as given
        listed = json.loads(runs["json list"].stdout)["pending"]
        assert listed[0]["arguments"]["name"] == HOSTILE
        assert json.loads(runs["json show"].stdout)["arguments"]["name"] == HOSTILE
    finally:
        client.close()
